"""flashscale.parallel"""
