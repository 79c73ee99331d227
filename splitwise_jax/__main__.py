"""`python -m splitwise_jax`: the list of commands (each has its own --help)."""

from __future__ import annotations

import sys

COMMANDS = (
    ("evaluate", "latency percentiles, SLOs, throughput, cost and power of one cluster"),
    ("optimize", "the cheapest (or least power, or highest throughput) cluster meeting the SLOs"),
    ("simulate", "request-level simulation of a cluster (SplitwiseSim's policies)"),
    ("calibrate", "fit the phase models to iteration profiles, or with --benchmarks to serving benchmarks"),
    ("predict", "profile-style iteration times, or with --benchmarks a benchmark table's percentiles"),
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    lines = ["usage: python -m splitwise_jax.<command> [--help] ...", "", "commands:"]
    lines += [f"  {name:<10} {what}" for name, what in COMMANDS]
    lines += ["", "parameter stacks (--params): paper-2023 (default), vllm-2026, or a params file;",
              "docs: README.md, docs/architecture.md, docs/serving.md"]
    print("\n".join(lines))
    if argv and argv[0] not in ("-h", "--help"):
        print(f"\nunknown argument {argv[0]!r}: run a command as python -m splitwise_jax.<command>", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
