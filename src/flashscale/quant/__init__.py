"""flashscale.quant"""
