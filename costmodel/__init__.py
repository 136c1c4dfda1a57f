"""Cost model: op time per device kind, transfer time per link, memory, the simulator."""
from costmodel.memory import all_alive_memory, memory_lower_bound
from costmodel.roofline import CostModel, roofline_time
from costmodel.simulate import (Schedule, fits_memory, live_peak, simulate, simulate_plan,
                                upward_rank)

__all__ = ["CostModel", "Schedule", "all_alive_memory", "fits_memory", "live_peak",
           "memory_lower_bound", "roofline_time", "simulate", "simulate_plan", "upward_rank"]
