// FlashMLA's sparse FP8 decode entry point alone, for bench_mla's `flashmla` arm (built by
// scripts/build_flashmla.sh over the tree scripts/stage_flashmla.sh puts in .peers/flashmla).
//
// FlashMLA's own api.cpp binds every kernel it has (dense decode, sparse and dense prefill, SM100). This
// binds `sparse_decode_fwd` only, through FlashMLA's unchanged interface (csrc/api/sparse_decode.h: the
// same checks, scheduler metadata, split buffers and combine). Its dispatcher names kernels that are not
// built here (MODEL1's record format, the SM100 programs); they are defined below as explicit
// specializations that refuse, so the module links, and a call that would reach one fails by name.
// Built: the SM90 V32 programs for 64 and 128 heads, the scheduler metadata and the combine kernels.

#include "api/common.h"
#include "params.h"
#include "sm90/decode/sparse_fp8/splitkv_mla.h"
#include "sm100/decode/head64/kernel.h"
#include "sm100/prefill/sparse/fwd_for_small_topk/head128/phase1.h"

namespace sm90::decode::sparse_fp8 {
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1, 64>(const SparseAttnDecodeParams &) {
    TORCH_CHECK(false, "FlashMLA (csf's build): the MODEL1 record format is not built");
}
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1, 128>(const SparseAttnDecodeParams &) {
    TORCH_CHECK(false, "FlashMLA (csf's build): the MODEL1 record format is not built");
}
}  // namespace sm90::decode::sparse_fp8

namespace sm100::decode::head64 {
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32>(const SparseAttnDecodeParams &) {
    TORCH_CHECK(false, "FlashMLA (csf's build): SM100 programs are not built (SM90 only)");
}
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1>(const SparseAttnDecodeParams &) {
    TORCH_CHECK(false, "FlashMLA (csf's build): SM100 programs are not built (SM90 only)");
}
}  // namespace sm100::decode::head64

namespace sm100::fwd_for_small_topk::head128 {
template <>
void run_fwd_for_small_topk_phase1_kernel<SparseAttnFwdMode::DecodeWithSplitKV, 512>(
    const SparseFwdArgT<SparseAttnFwdMode::DecodeWithSplitKV> &) {
    TORCH_CHECK(false, "FlashMLA (csf's build): SM100 programs are not built (SM90 only)");
}
}  // namespace sm100::fwd_for_small_topk::head128

#include "api/sparse_decode.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "FlashMLA 9241ae3: sparse FP8 decode (SM90) only";
    m.def("sparse_decode_fwd", &sparse_attn_decode_interface);
}
