"""Per-hop latency of request/response traffic along the datapath, from eBPF (bpftrace).

For a profile that asks for it (``hops: true``), each cell is measured twice, interleaved:
as it is, and traced (:mod:`.twins`, :mod:`.interleave`). The run's hook (:mod:`.hook`) puts tracers on the host and in
the guests around a traced sample's window (:mod:`.session`, :mod:`.tracer`), each running a program
rendered from the path's plan (:mod:`.plan`, :mod:`.program`) that times every data packet
from point to point in the kernel. Its hops' percentiles (:mod:`.parse`) are checked
against the tool's median round trip (:mod:`.closure`), and each round's traced sample
against its untraced one for what tracing cost (:mod:`.overhead`).

Docs: docs/hops.md.
"""
from __future__ import annotations

# the hook registers itself in testbed.measure.hooks.FACTORIES: whoever plans a run (its
# planner imports .twins) gets the tracer for the topologies that ask for it
from testbed.measure.hops import hook as _hook  # noqa: F401
