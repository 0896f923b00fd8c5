"""Code that both the manager (`orchestrator`) and the agents (`agents`) run, and that is not their contract.

The contract between the two sides -- models, tables and pure functions -- lives in `schemas`. This package
holds the few effectful helpers both sides need (running an external tool); it imports nothing of tcplab's
own, so neither side has to import the other's internals to use it.
"""
