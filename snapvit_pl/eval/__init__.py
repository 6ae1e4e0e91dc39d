"""Evaluation on frozen features: k-NN, linear probe, segmentation probe, throughput."""

from ..device import autocast_context, resolve_device
from .features import ExtractedFeatures, extract_features
from .knn import knn_classify, knn_vote_scores
from .linear_probe import LinearProbe, LinearProbeResult, fit_linear_probe, linear_probe, probe_accuracy
from .seg_probe import SegmentationHead, SegProbeResult, seg_probe, tokens_to_feature_map
from .suite import EvalData, EvaluationSettings, evaluate_model
from .throughput import ThroughputResult, measure_throughput

__all__ = [
    "EvalData",
    "EvaluationSettings",
    "ExtractedFeatures",
    "LinearProbe",
    "LinearProbeResult",
    "SegProbeResult",
    "SegmentationHead",
    "ThroughputResult",
    "autocast_context",
    "evaluate_model",
    "extract_features",
    "fit_linear_probe",
    "knn_classify",
    "knn_vote_scores",
    "linear_probe",
    "measure_throughput",
    "probe_accuracy",
    "resolve_device",
    "seg_probe",
    "tokens_to_feature_map",
]
