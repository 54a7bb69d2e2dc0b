"""flashscale.kernels"""
