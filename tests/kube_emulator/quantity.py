"""resource.Quantity (k8s.io/apimachinery/pkg/api/resource): parsing and the canonical form the API server
prints (`0.5` -> `500m`, `1536Mi`, `2k`). Pure."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

# The message ParseQuantity's callers get (resource.ErrFormatWrong's regexp).
FORMAT_ERROR = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"

_SYNTAX = re.compile(r"([+-]?)(\d+\.?\d*|\.\d+)((?:[KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?\Z")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {v: k for k, v in _DECIMAL.items()}
_NANO = Decimal("1e-9")


class QuantityError(ValueError):
    pass


@dataclass(frozen=True)
class Quantity:
    value: Decimal
    fmt: str  # "DecimalSI", "BinarySI" or "DecimalExponent"

    def __str__(self) -> str:
        return canonical(self)


def parse(raw: str | int | float) -> Quantity:
    """ParseQuantity: a number with an optional SI, binary or exponent suffix; finer than 1n rounds up."""
    text = str(raw) if not isinstance(raw, float) or not raw.is_integer() else str(int(raw))
    if isinstance(raw, float) and not math.isfinite(raw):
        raise QuantityError(FORMAT_ERROR)
    m = _SYNTAX.match(text)
    if m is None:
        raise QuantityError(FORMAT_ERROR)
    sign, number, suffix = m.group(1), m.group(2), m.group(3) or ""
    value = Decimal(number) * (-1 if sign == "-" else 1)
    if suffix in _BINARY:
        value, fmt = value * (1024 ** _BINARY[suffix]), "BinarySI"
    elif suffix[:1] in ("e", "E"):
        value, fmt = value.scaleb(int(suffix[1:])), "DecimalExponent"
    else:
        value, fmt = value.scaleb(_DECIMAL[suffix]), "DecimalSI"
    return Quantity(value.quantize(_NANO, rounding=ROUND_CEILING) if value % _NANO else value, fmt)


def _decimal_parts(value: Decimal) -> tuple[int, int]:
    """(mantissa, exponent) with the exponent a multiple of 3 (int64Amount.AsCanonicalBytes)."""
    sign, digits, exponent = value.normalize().as_tuple()
    mantissa = int("".join(map(str, digits)) or "0")
    assert isinstance(exponent, int)
    extra = exponent % 3
    return (-mantissa if sign else mantissa) * 10 ** extra, exponent - extra


def canonical(q: Quantity) -> str:
    """Quantity.String(): the shortest exact form in the quantity's own format."""
    value, fmt = q.value, q.fmt
    if value == 0:
        return "0"
    if fmt == "BinarySI" and (abs(value) < 1024 or value != value.to_integral_value()):
        fmt = "DecimalSI"
    if fmt == "BinarySI":
        number, power = int(value), 0
        while power < 6 and number % 1024 == 0:
            number, power = number // 1024, power + 1
        return f"{number}{'' if power == 0 else 'KMGTPE'[power - 1] + 'i'}"
    mantissa, exponent = _decimal_parts(value)
    if fmt == "DecimalExponent":
        return f"{mantissa}" + (f"e{exponent}" if exponent else "")
    while exponent > 18:
        mantissa, exponent = mantissa * 1000, exponent - 3
    return f"{mantissa}{_DECIMAL_SUFFIX[exponent]}"
