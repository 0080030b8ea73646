"""A compiled step's memory per chip, or what libtpu's out-of-memory message says it needed."""

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class Memory:
    """Per-chip bytes from `Compiled.memory_analysis()`."""

    arguments: int
    outputs: int
    aliased: int  # outputs that reuse a donated argument's buffer
    temporaries: int
    generated_code: int

    @property
    def total(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.generated_code

    @classmethod
    def of(cls, compiled) -> "Memory":
        m = compiled.memory_analysis()
        return cls(
            arguments=m.argument_size_in_bytes,
            outputs=m.output_size_in_bytes,
            aliased=m.alias_size_in_bytes,
            temporaries=m.temp_size_in_bytes,
            generated_code=m.generated_code_size_in_bytes,
        )


_SIZE = r"([\d.]+)([KMGT]?)i?B?"


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * 1024 ** "BKMGT".index(unit or "B"))


def required_bytes(oom_message: str) -> int | None:
    """A lower bound on the step's per-chip need, from libtpu's out-of-memory message (the
    compiler stops at the first allocation that does not fit)."""
    match = re.search(rf"Total hbm usage >= {_SIZE}", oom_message) or re.search(
        rf"required for HLO temporaries \({_SIZE}\) exceeds", oom_message
    )
    if match:
        return _bytes(*match.groups())
    match = re.search(
        rf"Used {_SIZE} of {_SIZE} hbm. Exceeded hbm capacity by {_SIZE}", oom_message
    )
    if match:
        return _bytes(*match.groups()[:2]) + _bytes(*match.groups()[4:])
    return None


def oom_summary(oom_message: str, allocations: int = 5) -> str:
    """libtpu's report cut to its totals and the largest allocations: what to shrink."""
    head, _, rest = oom_message.partition("Largest program allocations in hbm:")
    lines = [line for line in head.splitlines() if line.strip()]
    for block in re.split(r"\n\s*=+\s*\n", rest)[:allocations]:
        fields = [re.sub(r"^\d+\.\s*", "", line.strip()) for line in block.splitlines()]
        picked = [f for f in fields if f.startswith(("Size:", "Operator:", "Shape:"))]
        if picked:
            lines.append("  - " + "; ".join(picked))
    return "\n".join(lines)


def memory_of(compiled, oom: str | None) -> tuple[Memory | None, int | None]:
    """(the compiled step's memory, its per-chip total); after an OOM, (None, the compiler's
    lower bound on the total)."""
    if compiled is None:
        return None, required_bytes(oom)
    memory = Memory.of(compiled)
    return memory, memory.total
