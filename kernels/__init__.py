"""specpilot.kernels"""
