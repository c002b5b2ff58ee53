"""The moderation gate's classifier when the router does not hold the moderation model itself
(security.gate_classifier): the moderation deployment, called directly (not via a colo), in a
region where it is warm if there is one."""

from __future__ import annotations

from dataclasses import dataclass

from deployments.ingress.edge.calls import HandleCall
from deployments.ingress.edge.pools import RegionPools


@dataclass(frozen=True)
class ModerationDeployment:
    """A `security.moderation_gate.Classify`: one flag per text, from the deployment's verdicts."""

    pools: RegionPools
    model: str

    async def __call__(self, texts: list[str]) -> list[bool]:
        handle = self.pools.serving_handle(self.model)
        result = await HandleCall("classify", (texts,)).run(handle)
        return [verdict.flagged for verdict in result.reply.value]
