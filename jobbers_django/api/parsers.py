"""The request bodies the jobbers endpoints read: JSON, refused with a 400 when nested too
deep to parse (Python's decoder raises ``RecursionError`` near 1,000 levels, which DRF's own
parser lets through as a 500)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

__all__ = ["BoundedJSONParser"]


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser, with a body nested too deep to parse answered as a 400."""

    def parse(self, stream: IO[Any], media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deep") from None
