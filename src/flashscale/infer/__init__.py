"""flashscale.infer"""
