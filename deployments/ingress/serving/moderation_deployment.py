"""The moderation gate's classifier when the router does not hold the moderation model itself
(security.gate_classifier): the moderation deployment, called directly (not via a colo), in a
region where it is warm if there is one."""

from __future__ import annotations

from dataclasses import dataclass

from deployments.contracts.moderation_deployment import ClassifyRequest, ModerationClient
from deployments.ingress.edge.calls import ModelCall
from deployments.ingress.edge.pools import RegionPools


@dataclass(frozen=True)
class ModerationDeployment:
    """A `security.moderation_gate.Classify`: one flag per text, from the deployment's verdicts."""

    pools: RegionPools
    model: str

    async def __call__(self, texts: list[str]) -> list[bool]:
        client = self.pools.serving_client(self.model)
        result = await ModelCall(ModerationClient.classify, ClassifyRequest(texts)).run(client)
        return [verdict.flagged for verdict in result.reply.value]
