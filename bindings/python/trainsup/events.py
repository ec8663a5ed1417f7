"""The Python side of the event format (docs/events.md): keyword fields become (name, JSON text)
pairs for the C++ library's one event log writer (trainsup/event_log.h), which ranks
(Supervisor.event) and launcher agents (agent_events.AgentEvents) both write through. Strings
stay strings; numbers, bools, None, lists and dicts keep their JSON types; anything else (and
NaN or infinity, which JSON has not) is written as its str()."""
import json
from typing import Any, Dict, List, Tuple

__all__ = ["json_fields"]


def json_fields(fields: Dict[str, Any]) -> List[Tuple[str, str]]:
    """[(name, JSON text)] of `fields` (a dict), in order."""
    out = []
    for k, v in fields.items():
        try:
            out.append((k, json.dumps(v, allow_nan=False)))
        except (TypeError, ValueError):
            out.append((k, json.dumps(str(v))))
    return out
