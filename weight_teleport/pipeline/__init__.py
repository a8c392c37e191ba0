"""Publish weight versions from a trainer; follow them on samplers, anywhere."""

from weight_teleport.pipeline.config import PublisherConfig, RetentionConfig, SubscriberConfig
from weight_teleport.pipeline.errors import SubscriberFailed
from weight_teleport.pipeline.group import PartResult, PublisherGroup
from weight_teleport.pipeline.health import Health
from weight_teleport.pipeline.metrics import PublishResult, SubscriberStats, UpdateReport
from weight_teleport.pipeline.publisher import PublishHandle, Publisher
from weight_teleport.pipeline.subscriber import Subscriber

__all__ = [
    "Health",
    "PartResult",
    "PublishHandle",
    "PublishResult",
    "Publisher",
    "PublisherConfig",
    "PublisherGroup",
    "RetentionConfig",
    "Subscriber",
    "SubscriberConfig",
    "SubscriberFailed",
    "SubscriberStats",
    "UpdateReport",
]
