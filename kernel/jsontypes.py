"""Names for JSON-shaped values, instead of `Any`.

- `JSON`: any JSON value, recursively (what `json.loads` returns, what a JSONField holds).
- `JSONObject`: a JSON object whose values are JSON.
- `Body`: an object built to be serialised (a response body, a Celery payload, an export
  row): its values are only written out, never read back through this type, so `object`
  says enough and every value type fits.

Where code reads fields of a payload, give the payload a TypedDict of its own instead.
"""

from __future__ import annotations

from typing import TypeAlias

JSON: TypeAlias = "None | bool | int | float | str | list[JSON] | dict[str, JSON]"
JSONObject: TypeAlias = "dict[str, JSON]"
Body: TypeAlias = "dict[str, object]"
