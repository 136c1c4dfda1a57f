"""Cost model: op time per device kind, transfer time per link, memory, the simulator."""
from costmodel.memory import device_memory
from costmodel.roofline import CostModel, roofline_time
from costmodel.simulate import Schedule, simulate, simulate_plan, upward_rank

__all__ = ["CostModel", "Schedule", "device_memory", "roofline_time",
           "simulate", "simulate_plan", "upward_rank"]
