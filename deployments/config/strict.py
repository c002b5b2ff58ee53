"""The base of every settings model: an unknown field is an error naming it (a typo in
serve_config.yaml is never silently ignored), and a parsed config cannot change under the code
that read it."""

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
