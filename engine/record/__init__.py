"""Capture: `tandem record` and `tandem attach` (the Python side; the agent is java-agent/).

- session.py: the session directory and its session.json (layout: docs/session.md)
- launch.py: the environment that makes JVMs and CPython interpreters record, and running
  the user's command with signals forwarded
- attach.py: loading the agent into a JVM that is already running
- summary.py: what a session captured, per process
"""
