"""Advantages: registered estimators over the node table (``estimators``) and their settings (``config``)."""
