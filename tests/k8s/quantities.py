"""Resource quantities in the canonical form a real API server stores them in.

`cpu: "0.5"` is stored as `500m`, `1000m` as `1`, `memory: 2048Mi` as `2Gi`: code that compares
what it rendered with what it reads back must expect this, so the emulator does it too
(apimachinery's `Quantity` canonicalization, for the values that tests use).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?\d+))?$"
)


def canonical(quantity: Any) -> Any:
    """The canonical string of a quantity; what it cannot parse is left for validation."""
    found = _QUANTITY.match(str(quantity).strip())
    if found is None or isinstance(quantity, bool):
        return quantity
    number, suffix, exponent = found.groups()
    value = Fraction(number)
    if suffix in _BINARY:
        value *= 1024 ** _BINARY[suffix]
        if value.denominator == 1 and value >= 1024:
            power = max(p for p in range(7) if value % (1024**p) == 0)
            name = next((k for k, v in _BINARY.items() if v == power), "")
            return f"{value // 1024**power}{name}"
    elif exponent is not None:
        value *= Fraction(10) ** int(exponent)
        for power in range(18, -10, -3):  # exponent form stays exponent form: 129e6, 1e3
            scaled = value / Fraction(10) ** power
            if scaled.denominator == 1 and scaled != 0:
                return f"{scaled.numerator}e{power}" if power else str(scaled.numerator)
        return "0"
    else:
        value *= Fraction(10) ** _DECIMAL[suffix or ""]
    # Decimal SI: the largest suffix that keeps an integer; finer than nano rounds up.
    nanos = -(-value * 10**9 // 1)
    for name, power in sorted(_DECIMAL.items(), key=lambda item: -item[1]):
        scaled = Fraction(nanos, 10**9) / Fraction(10) ** power
        if scaled.denominator == 1 and (scaled != 0 or power == 0):
            return f"{scaled.numerator}{name}"
    return str(quantity)


def canonical_resources(pod_spec: dict[str, Any]) -> None:
    """Canonicalize the containers' requests and limits of a pod spec, in place."""
    for key in ("containers", "initContainers"):
        for container in pod_spec.get(key) or []:
            for section in ("requests", "limits"):
                values = (container.get("resources") or {}).get(section)
                if isinstance(values, dict):
                    for name, value in values.items():
                        values[name] = canonical(value)
