"""The service's live retrieval budget, by its earlier name: the controller is :mod:`ragate.state.budget`, below both the
service and :class:`ragate.Pipeline`."""

from ragate.state.budget import DEFAULT_GAIN, BudgetController, check_state_path, control_level  # noqa: F401
