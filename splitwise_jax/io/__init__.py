"""Layer 4, io: readers and writers of user files that describe whole clusters.

`design_file` (a design TOML/JSON file -> a `Cluster`, and back). Readers that a lower
layer needs live beside it (`specs.hf_config`, `specs.catalog`'s spec files,
`phases.params`' parameter file, `phases.profiles`, `cluster.workload`'s traces).
See docs/architecture.md.
"""
