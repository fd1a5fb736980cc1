"""mcore's own custom ops (mcore::decode_attention, mcore::gemv) and their Triton kernels."""
