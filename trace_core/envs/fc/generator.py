"""Synthetic function-calling tasks against the sandboxed ``World`` (inventory, calendar, rooms).

Difficulty knob (calls needed, functions offered, dependency between calls):

=====  =====  =========  =============================================================
level  calls  functions  templates
=====  =====  =========  =============================================================
0      1      1          get stock / find event / add stock
1      1      3          + remove stock; two distractor functions
2      2      5          book a room on an event's day (nested: the day comes from a call)
3      3      7          add an event on another's day and book it; cancel then book
=====  =====  =========  =============================================================

The answer is the last call's output (a count, a day, a booking id); the reward also needs the
final state to equal the expected one (computed by running the demonstration's calls).
"""

from __future__ import annotations

import numpy as np

from trace_core.envs.actions import OK
from trace_core.envs.base import Task
from trace_core.envs.fc.world import FUNCTIONS, World

ITEMS = ("apple", "pear", "plum", "lime", "fig", "kiwi", "nut", "egg")
TITLES = ("demo", "sync", "party", "lunch", "review", "talk", "trip", "exam")
ROOMS = ("A", "B", "C", "D")
_TEMPLATES = {0: ("get", "find", "add"), 1: ("get", "add", "remove", "find"),
              2: ("book_on_event", "move"), 3: ("event_and_book", "cancel_and_book")}
_N_FUNCTIONS = {0: 0, 1: 3, 2: 5, 3: 7}  # 0: only the functions the task needs


def _state(rng: np.random.Generator) -> dict:
    items = rng.choice(ITEMS, size=3, replace=False)
    titles = rng.choice(TITLES, size=3, replace=False)
    days = rng.choice(np.arange(1, 29), size=3, replace=False)
    state = {"stock": {str(i): int(rng.integers(3, 21)) for i in items},
             "events": {str(t): int(d) for t, d in zip(titles, days, strict=True)},
             "bookings": {}, "next_id": 1}
    for _ in range(int(rng.integers(0, 3))):
        state["bookings"][f"b{state['next_id']}"] = [str(rng.choice(ROOMS)), int(rng.integers(1, 29))]
        state["next_id"] += 1
    return state


def _free_room(rng: np.random.Generator, state: dict, day: int) -> str:
    taken = {r for r, d in state["bookings"].values() if d == day}
    return str(rng.choice([r for r in ROOMS if r not in taken]))


def _template(rng: np.random.Generator, name: str, s: dict) -> tuple[str, list[tuple[str, dict]]]:
    """(question, calls) for one template over state ``s``."""
    item, item2 = (str(x) for x in rng.choice(list(s["stock"]), size=2, replace=False))
    title = str(rng.choice(list(s["events"])))
    day, n = s["events"][title], int(rng.integers(1, 10))
    if name == "get":
        return f"How many {item} are in stock?", [("get_stock", {"item": item})]
    if name == "add":
        return f"Add {n} {item} to stock. How many now?", [("add_stock", {"item": item, "qty": n})]
    if name == "remove":
        n = int(rng.integers(1, s["stock"][item] + 1))
        return f"Remove {n} {item} from stock. How many left?", [("remove_stock", {"item": item, "qty": n})]
    if name == "find":
        return f"What day is the {title}?", [("find_event", {"title": title})]
    room = _free_room(rng, s, day)
    if name == "book_on_event":
        return (f"Book room {room} on the day of the {title}.",
                [("find_event", {"title": title}), ("book_room", {"room": room, "day": day})])
    if name == "move":
        n = int(rng.integers(1, s["stock"][item] + 1))
        return (f"Remove {n} {item} and add {n} {item2}. How many {item2} now?",
                [("remove_stock", {"item": item, "qty": n}), ("add_stock", {"item": item2, "qty": n})])
    if name == "event_and_book":
        new = str(rng.choice([t for t in TITLES if t not in s["events"]]))
        return (f"Put the {new} on the day of the {title} and book room {room} that day.",
                [("find_event", {"title": title}), ("add_event", {"title": new, "day": day}),
                 ("book_room", {"room": room, "day": day})])
    # cancel_and_book: cancel an existing booking (made first if there is none) then book
    if not s["bookings"]:
        s["bookings"]["b1"], s["next_id"] = [str(rng.choice(ROOMS)), int(rng.integers(1, 29))], 2
    bid = str(rng.choice(list(s["bookings"])))
    after = {k: v for k, v in s["bookings"].items() if k != bid}
    room = str(rng.choice([r for r in ROOMS if all(not (r == r2 and d2 == day) for r2, d2 in after.values())]))
    return (f"Cancel booking {bid} and book room {room} on the day of the {title}.",
            [("cancel_booking", {"booking_id": bid}), ("find_event", {"title": title}),
             ("book_room", {"room": room, "day": day})])


def make_fc_task(rng: np.random.Generator, difficulty: int, prompt_id: str) -> Task:
    state = _state(rng)
    question, calls = _template(rng, str(rng.choice(_TEMPLATES[difficulty])), state)
    world, answer = World(state), ""
    for name, args in calls:
        answer, reason = world.call(name, args)
        assert reason == OK, (prompt_id, name, args, answer)  # generator bug, not model input
    needed = list(dict.fromkeys(n for n, _ in calls))
    others = [f for f in FUNCTIONS if f not in needed]
    extra = max(0, _N_FUNCTIONS[difficulty] - len(needed))
    functions = needed + [str(f) for f in rng.choice(others, size=extra, replace=False)]
    functions = [functions[i] for i in rng.permutation(len(functions))]
    return Task(
        prompt_id=prompt_id,
        family="fc",
        difficulty=difficulty,
        question=question,
        payload={"mode": "sandbox", "functions": functions, "state": state, "expected_state": world.state,
                 "answer": answer, "calls": [[n, a] for n, a in calls], "source": "synthetic"},
    )
