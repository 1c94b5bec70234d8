"""Options of the ``offline`` generator (a light module: loading the plugin does not import torch)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class OfflineOptions(BaseModel):
    """Options of the ``offline`` generator."""

    model_config = ConfigDict(extra="forbid")

    step_probability: float = Field(
        default=0.35, ge=0, le=1, description="chance an improvement changes recipe"
    )
    mutations: int = Field(default=2, ge=1, description="most parameters changed by one improvement")
    max_tries: int = Field(default=40, ge=1, description="attempts to find an unseen, valid proposal")
