"""Griffe extension for the docs site: reST roles in docstrings become inline code.

jobbers' docstrings name other objects with Sphinx roles (``:class:`Jobbers```,
``:meth:`cancel```, ``:class:`~jobbers_celery.worker.shutdown.WorkerShuttingDown```), which
Markdown would print as typed. When griffe loads a docstring this turns each role into the
name in code font (``~`` keeps the last component, as in Sphinx). The source is untouched.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(
    r":(?:py:)?(?:class|meth|func|attr|mod|exc|data|obj|const):`(~?)([^`]+)`"
)


def _code(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_code, obj.docstring.value)
