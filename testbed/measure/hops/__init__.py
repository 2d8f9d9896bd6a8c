"""Per-hop latency of request/response traffic along the datapath, from eBPF (bpftrace).

For a profile that asks for it (``hops: true``), each cell is measured twice, interleaved:
as it is, and traced (:mod:`.interleave`). A traced sample has tracers on the host and in
the guests around its window (:mod:`.session`, :mod:`.tracer`), each running a program
rendered from the path's plan (:mod:`.plan`, :mod:`.program`) that times every data packet
from point to point in the kernel. Its hops' percentiles (:mod:`.parse`) are checked
against the tool's median round trip (:mod:`.closure`), and each round's traced sample
against its untraced one for what tracing cost (:mod:`.overhead`).

Docs: docs/hops.md.
"""
