"""Inference on bundles with onnxruntime: the bundle format, pipelines, the one evaluation loop, batch
jobs, the HTTP server and its routes. No torch, directly or indirectly: an import-linter contract holds it."""
