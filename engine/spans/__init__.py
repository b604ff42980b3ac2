"""Which requests the pauses hurt: a service's OpenTelemetry spans beside the JVM pauses and GIL states.

A source (`source`: OTLP JSON files into a spans table), its clock (`clock`: the spans' wall
clock put on CLOCK_MONOTONIC with the session's own wall/monotonic pairs), a computation
(`figures`: per span, time in JVM stops of the world and waiting for the GIL) and a sink
(`outputs`: spans.parquet and requests.parquet); `receiver` takes spans over OTLP/HTTP and
`live` figures them as `tandem live` runs. Spec: docs/spans.md.
"""
