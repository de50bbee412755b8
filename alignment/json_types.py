"""The one name for a JSON object at a true boundary: a wire message, an HTTP body, a file read back.

Typed records travel between stages; a ``JsonObject`` is what they become (``to_json()``) or come from
when they cross the process's edge, so ``Any`` appears here and nowhere inside the product.
"""

from __future__ import annotations

from typing import Any, TypeAlias

#: A parsed or to-be-written JSON object (values are JSON: str, int, float, bool, None, lists, objects).
JsonObject: TypeAlias = dict[str, Any]
