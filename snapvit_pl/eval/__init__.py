"""Evaluation on frozen features: k-NN, linear probe, segmentation probe, throughput."""

from snapvit_pl.eval.features import ExtractedFeatures, autocast_context, extract_features, resolve_device
from snapvit_pl.eval.knn import knn_classify, knn_vote_scores
from snapvit_pl.eval.linear_probe import LinearProbe, LinearProbeResult, fit_linear_probe, linear_probe, probe_accuracy
from snapvit_pl.eval.seg_probe import SegmentationHead, SegProbeResult, seg_probe, tokens_to_feature_map
from snapvit_pl.eval.throughput import ThroughputResult, measure_throughput

__all__ = [
    "ExtractedFeatures",
    "LinearProbe",
    "LinearProbeResult",
    "SegProbeResult",
    "SegmentationHead",
    "ThroughputResult",
    "autocast_context",
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
