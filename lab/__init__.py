"""The lab: demo and test equipment, above the stages it drives (it may import the core and every stage;
nothing in the core or a stage imports it).

`pipeline` is `opsloop run` (`make run`): the stack, an HAProxy edge (`edge`) in front of toy origins
(`origin`), a paced traffic generator (`traffic`), simulated BMCs (`bmcsim`), a pager standing in for
the on-call (`pager`), then every service. `keystone_server` is a real Keystone with an S3 front end for
the Keystone collector. The end-to-end tests and the benchmarks use the same pieces.
"""
