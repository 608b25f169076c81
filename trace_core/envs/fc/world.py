"""A sandboxed, deterministic in-memory API (inventory, calendar, room booking) for the multi-turn
function-calling tasks. State is a plain JSON-able dict; every function mutates a private copy
and returns ``(observation, reason)``; nothing touches the outside world.

State: ``{"stock": {item: qty}, "events": {title: day}, "bookings": {id: [room, day]}, "next_id": n}``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from trace_core.envs.actions import OK, TOOL_ERROR
from trace_core.envs.prompts import function_schema

MAX_QTY = 10_000
_ITEM, _QTY = ("string", "item name"), ("integer", "units")
_TITLE, _DAY = ("string", "event title"), ("integer", "1-28")

SCHEMAS: dict[str, dict[str, Any]] = {
    s["name"]: s
    for s in [
        function_schema("get_stock", "Units of an item in stock.", item=_ITEM),
        function_schema("add_stock", "Add units of an item; returns the new count.", item=_ITEM, qty=_QTY),
        function_schema("remove_stock", "Remove units of an item; returns the new count.", item=_ITEM, qty=_QTY),
        function_schema("find_event", "Day of the month of an event.", title=_TITLE),
        function_schema("add_event", "Put an event on a day.", title=_TITLE, day=_DAY),
        function_schema("book_room", "Book a room on a day; returns the booking id.",
                        room=("string", "room name"), day=_DAY),
        function_schema("cancel_booking", "Cancel a booking.", booking_id=("string", "e.g. b2")),
    ]
}
FUNCTIONS = tuple(SCHEMAS)


class World:
    """The API over one state. ``call(name, args) -> (observation, reason)``."""

    def __init__(self, state: dict[str, Any]):
        self.state = copy.deepcopy(state)
        self._impl: dict[str, Callable[..., tuple[str, str]]] = {
            "get_stock": self.get_stock,
            "add_stock": self.add_stock,
            "remove_stock": self.remove_stock,
            "find_event": self.find_event,
            "add_event": self.add_event,
            "book_room": self.book_room,
            "cancel_booking": self.cancel_booking,
        }

    def call(self, name: str, args: dict[str, Any]) -> tuple[str, str]:
        try:
            return self._impl[name](**args)
        except (KeyError, TypeError):
            return "error: bad call", TOOL_ERROR

    def get_stock(self, item: str) -> tuple[str, str]:
        stock = self.state["stock"]
        return (str(stock[item]), OK) if item in stock else ("error: unknown item", TOOL_ERROR)

    def add_stock(self, item: str, qty: int) -> tuple[str, str]:
        if not 0 < qty <= MAX_QTY:
            return "error: bad qty", TOOL_ERROR
        stock = self.state["stock"]
        stock[item] = stock.get(item, 0) + qty
        return str(stock[item]), OK

    def remove_stock(self, item: str, qty: int) -> tuple[str, str]:
        stock = self.state["stock"]
        if item not in stock:
            return "error: unknown item", TOOL_ERROR
        if not 0 < qty <= stock[item]:
            return "error: not enough", TOOL_ERROR
        stock[item] -= qty
        return str(stock[item]), OK

    def find_event(self, title: str) -> tuple[str, str]:
        ev = self.state["events"]
        return (str(ev[title]), OK) if title in ev else ("error: no such event", TOOL_ERROR)

    def add_event(self, title: str, day: int) -> tuple[str, str]:
        if not 1 <= day <= 28:
            return "error: bad day", TOOL_ERROR
        if title in self.state["events"]:
            return "error: exists", TOOL_ERROR
        self.state["events"][title] = day
        return "ok", OK

    def book_room(self, room: str, day: int) -> tuple[str, str]:
        if not 1 <= day <= 28:
            return "error: bad day", TOOL_ERROR
        if any(r == room and d == day for r, d in self.state["bookings"].values()):
            return "error: taken", TOOL_ERROR
        bid = f"b{self.state['next_id']}"
        self.state["next_id"] += 1
        self.state["bookings"][bid] = [room, day]
        return bid, OK

    def cancel_booking(self, booking_id: str) -> tuple[str, str]:
        if booking_id not in self.state["bookings"]:
            return "error: no such booking", TOOL_ERROR
        del self.state["bookings"][booking_id]
        return "ok", OK
