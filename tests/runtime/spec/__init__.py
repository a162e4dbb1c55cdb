"""Speculative decoding (radixlm/runtime/spec): sources, the draft path, runners, trees and verification."""
