"""A setting declared once, as Debezium declares a connector's fields.

Each setting is one :class:`Setting`: the name users write (a flag, `--batch-size`,
or a Spark option, `pollTimeoutMs`), its default, its doc, its environment
variable, how its text is parsed and what it must be. Everything else is derived
from the declarations: the relay's flags and the defaults of `RelaySettings`,
kafka_rc's option parser, PostgresSink's defaults and checks, and the docs'
tables, which tests check against them.
A bad value is one line with a code (`SETTING_*`), the same in every component.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from outbox.core.errors import CORE

T = TypeVar("T")


def boolean(text: str) -> bool:
    """`true` or `false`, in any case, as Spark's options take them."""
    if text.lower() not in ("true", "false"):
        raise ValueError(text)
    return text.lower() == "true"


_KINDS: dict[Callable[[str], Any], str] = {int: "an integer", float: "a number", boolean: "true or false"}


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting: name, default, doc, environment variable, parser and checks.

    `parse` turns the text given (a flag, a variable, a Spark option) into the
    value, raising ValueError when it cannot; `choices`, `positive` and `limits` say
    what a value must be (a float, finite), whether it came as text or from Python.
    """

    name: str
    default: T
    doc: str
    parse: Callable[[str], T]
    env: str | None = None
    choices: tuple[Any, ...] | None = None
    positive: bool = False
    limits: tuple[float, float] | None = None  # the least and most a number may be
    called: str | None = None  # how a message names it, when not as a flag or an option

    @property
    def key(self) -> str:
        """The attribute that holds it: `--batch-size` -> batch_size, `pollTimeoutMs` -> poll_timeout_ms."""
        name = re.sub(r"(?<=[a-z])([A-Z])", r"_\1", self.name.lstrip("-"))
        return name.replace("-", "_").replace(".", "_").lower()

    @property
    def label(self) -> str:
        """How a message names it: the flag itself, `option NAME`, or as it says it is `called`."""
        if self.called:
            return self.called
        return self.name if self.name.startswith("-") else f"option {self.name}"

    @property
    def shown(self) -> str | None:
        """The default as the docs and the help show it; None when there is none."""
        if self.default is None:
            return None
        if isinstance(self.default, bool):
            return str(self.default).lower()  # as a flag, a variable or a Spark option says it
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)

    def read(self, text: str | None) -> T:
        """The value of `text`, parsed and checked; the default when it is not given."""
        if text is None:
            return self.default
        try:
            value = self.parse(text.strip())
        except ValueError:
            kind = _KINDS.get(self.parse, "valid")
            raise CORE.error("SETTING_MALFORMED", setting=self.label, kind=kind, value=text) from None
        return self.check(value)

    def check(self, value: T) -> T:
        if value is None:
            return value
        if self.choices is not None and value not in self.choices:
            choices = ", ".join(str(c) for c in self.choices)
            raise CORE.error("SETTING_NOT_A_CHOICE", setting=self.label, choices=choices, value=value)
        if isinstance(value, float) and not math.isfinite(value):  # an interval PostgreSQL cannot hold
            raise CORE.error("SETTING_NOT_FINITE", setting=self.label, value=value)
        if self.positive and not value > 0:  # type: ignore[operator]  # positive is declared on numbers only
            raise CORE.error("SETTING_NOT_POSITIVE", setting=self.label, value=value)
        if self.limits is not None and not self.limits[0] <= value <= self.limits[1]:  # type: ignore[operator]
            least, most = self.limits
            raise CORE.error("SETTING_OUT_OF_RANGE", setting=self.label, least=least, most=most, value=value)
        return value


def check_all(settings: Iterable[Setting[Any]], values: object) -> None:
    """Each declared setting's check on the attribute of `values` that holds it, where one does."""
    for setting in settings:
        if hasattr(values, setting.key):
            setting.check(getattr(values, setting.key))
