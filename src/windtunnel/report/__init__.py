"""Figures and reports. Everything here reads saved analysis results; nothing runs a model."""
