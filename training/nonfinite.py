"""The watch on skipped steps: steps whose loss or gradients were not finite are counted on the device, and read
only where the loop reads the device anyway, so the watch never makes a step wait."""
from __future__ import annotations

import torch


class NonFiniteWatch:
    def __init__(self, device: torch.device):
        self.streak = torch.zeros((), dtype=torch.long, device=device)  # skipped steps in a row, still going on
        self.longest = torch.zeros((), dtype=torch.long, device=device)  # the longest such run since the last look

    def update(self, finite: torch.Tensor) -> None:
        self.streak = (self.streak + 1) * ~finite
        self.longest = torch.maximum(self.longest, self.streak)

    def looked(self) -> None:
        """The longest run was read: from now on it counts from the run still going on."""
        self.longest = self.streak
