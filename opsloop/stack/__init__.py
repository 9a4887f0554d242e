"""Local real components (Kafka, Prometheus, Alertmanager) run as processes, stopped by PID."""

from opsloop.stack.manager import Stack
from opsloop.stack.process import ManagedProcess, StackError, free_port

__all__ = ["ManagedProcess", "Stack", "StackError", "free_port"]
