// The test program of a `tuner export-dispatch` header (tests/tuner/test_tuner_dispatch.py,
// tests/gpu/test_deploy_gpu.py). Build, with the header's folder on the include path:
//
//     nvcc -std=c++17 -arch=sm_90a -DFAMILY_ATTENTION -I out/ -o check tests/dispatch/check_dispatch.cu -ldl
//     (-DFAMILY_GEMM for gemm's header)
//
//     ./check pick 2,8,1500,64 fp16 causal=true      # the pick and its launch, as JSON (no GPU needed)
//     ./check compile 2,8,1500,64 fp16 causal=true   # NVRTC on the pick's source (no GPU needed)
//     ./check run 2,8,1500,64 fp16 causal=true       # on the GPU against a float64 reference, as JSON
//
// `run` fills the inputs with normal values (a fixed seed), the output with NaN (0xFF bytes), runs
// the header's run() on the default stream, counts NaN and Inf in the whole output and compares
// rows with a float64 reference: attention the first and last 4 rows and 8 in between of the
// first and last head, gemm 16 rows of C; the tolerances are the family's (templates/*/problem.py).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#if defined(FAMILY_ATTENTION)
#include "attention_dispatch.h"
namespace tk = tuned_attention;
#elif defined(FAMILY_GEMM)
#include "gemm_dispatch.h"
namespace tk = tuned_gemm;
#else
#error "define FAMILY_ATTENTION or FAMILY_GEMM"
#endif

static std::string quote(const std::string& text) {
    std::string out = "\"";
    for (char c : text) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out + "\"";
}

static tk::Problem parse(int argc, char** argv) {
    tk::Problem p;
    std::stringstream dims(argv[2]);
    for (std::string part; std::getline(dims, part, ',');) p.shape.push_back(std::stoll(part));
    p.dtype = argv[3];
    for (int i = 4; i < argc; ++i) {
        std::string flag = argv[i];
        size_t eq = flag.find('=');
        p.flags[flag.substr(0, eq)] = flag.substr(eq + 1);
    }
    return p;
}

static std::string plan_json(const tk::Plan& plan) {
    std::ostringstream out;
    out << "{\"kernel\": " << quote(plan.kernel) << ", \"grid\": [" << plan.grid[0] << ", " << plan.grid[1] << ", "
        << plan.grid[2] << "], \"block\": [" << plan.block[0] << ", " << plan.block[1] << ", " << plan.block[2]
        << "], \"dynamic_smem_bytes\": " << plan.smem_bytes << ", \"grid_x_max_blocks_per_sm\": "
        << plan.blocks_per_sm_cap << ", \"workspace\": [";
    for (size_t i = 0; i < plan.workspace.size(); ++i)
        out << (i ? ", " : "") << "{\"buffer\": " << quote(plan.workspace[i].first) << ", \"bytes\": "
            << plan.workspace[i].second << "}";
    out << "], \"args\": [";
    for (size_t i = 0; i < plan.args.size(); ++i) {
        const tk::Arg& a = plan.args[i];
        out << (i ? ", " : "");
        if (a.kind == tk::Arg::BUFFER) out << "{\"kind\": \"buffer\", \"value\": " << quote(a.buffer) << "}";
        if (a.kind == tk::Arg::I32) out << "{\"kind\": \"i32\", \"value\": " << a.i32 << "}";
        if (a.kind == tk::Arg::F32) {
            char text[64];
            std::snprintf(text, sizeof text, "%.9g", a.f32);
            out << "{\"kind\": \"f32\", \"value\": " << text << "}";
        }
        if (a.kind == tk::Arg::TENSORMAP) {
            const tk::TensorMapSpec& m = a.map;
            out << "{\"kind\": \"tensormap\", \"value\": {\"buffer\": " << quote(m.buffer)
                << ", \"element_bytes\": " << m.element_bytes << ", \"dims\": [";
            for (int j = 0; j < m.rank; ++j) out << (j ? ", " : "") << m.dims[j];
            out << "], \"strides\": [";
            for (int j = 0; j + 1 < m.rank; ++j) out << (j ? ", " : "") << m.strides[j];
            out << "], \"box\": [";
            for (int j = 0; j < m.rank; ++j) out << (j ? ", " : "") << m.box[j];
            out << "], \"swizzle\": " << m.swizzle << ", \"l2_promotion\": " << m.l2_promotion << "}}";
        }
    }
    out << "]}";
    return out.str();
}

static std::string pick_json(const tk::Pick& chosen) {
    std::ostringstream out;
    out.precision(17);
    out << "\"source\": " << quote(chosen.source) << ", \"measured\": " << (chosen.measured ? "true" : "false")
        << ", \"distance\": " << chosen.distance << ", \"passed_over\": [";
    for (size_t i = 0; i < chosen.passed_over.size(); ++i) out << (i ? ", " : "") << quote(chosen.passed_over[i]);
    out << "]";
    return out.str();
}

// -- inputs and the float64 reference -------------------------------------------------------------
static bool bf16_type(const tk::Problem& p) { return p.dtype == "bf16"; }

static uint16_t to_bits(float v, bool bf16) {
    uint16_t bits;
    if (bf16) {
        __nv_bfloat16 h = __float2bfloat16_rn(v);
        std::memcpy(&bits, &h, 2);
    } else {
        __half h = __float2half_rn(v);
        std::memcpy(&bits, &h, 2);
    }
    return bits;
}

static double from_bits(uint16_t bits, bool bf16) {
    if (bf16) {
        __nv_bfloat16 h;
        std::memcpy(&h, &bits, 2);
        return (double)__bfloat162float(h);
    }
    __half h;
    std::memcpy(&h, &bits, 2);
    return (double)__half2float(h);
}

static std::vector<uint16_t> normal(size_t count, bool bf16, unsigned seed, double scale = 1.0) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> draw(0.0f, 1.0f);
    std::vector<uint16_t> out(count);
    for (auto& v : out) v = to_bits((float)(draw(rng) * scale), bf16);
    return out;
}

struct Device {
    std::vector<std::pair<std::string, void*>> owned;
    ~Device() {
        for (auto& [name, ptr] : owned) cudaFree(ptr);
    }
    CUdeviceptr upload(const std::string& name, const std::vector<uint16_t>& host) {
        void* ptr = nullptr;
        if (cudaMalloc(&ptr, host.size() * 2) != cudaSuccess) throw tk::Error("cudaMalloc failed for " + name);
        cudaMemcpy(ptr, host.data(), host.size() * 2, cudaMemcpyHostToDevice);
        owned.emplace_back(name, ptr);
        return (CUdeviceptr)ptr;
    }
    CUdeviceptr poisoned(const std::string& name, size_t count) {
        void* ptr = nullptr;
        if (cudaMalloc(&ptr, count * 2) != cudaSuccess) throw tk::Error("cudaMalloc failed for " + name);
        cudaMemset(ptr, 0xFF, count * 2);  // 0xFFFF: NaN in fp16 and bf16
        owned.emplace_back(name, ptr);
        return (CUdeviceptr)ptr;
    }
};

struct Outcome {
    double error = 0.0, tolerance = 0.0;
    long long nonfinite = 0;
};

static long long count_nonfinite(const std::vector<uint16_t>& out, bool bf16) {
    const uint16_t exponent = bf16 ? 0x7F80 : 0x7C00;
    long long bad = 0;
    for (uint16_t v : out) bad += (v & exponent) == exponent;
    return bad;
}

#if defined(FAMILY_ATTENTION)
static Outcome run_family(const tk::Problem& p) {
    const long long B = p.shape[0], H = p.shape[1], S = p.shape[2], D = p.shape[3];
    const bool bf16 = bf16_type(p), causal = p.flag("causal") == "true";
    const size_t count = (size_t)(B * H * S * D);
    std::vector<uint16_t> q = normal(count, bf16, 1), k = normal(count, bf16, 2), v = normal(count, bf16, 3);
    Device dev;
    std::map<std::string, CUdeviceptr> buffers = {{"q", dev.upload("q", q)}, {"k", dev.upload("k", k)},
                                                  {"v", dev.upload("v", v)}, {"o", dev.poisoned("o", count)}};
    tk::run(p, buffers, nullptr);
    if (cudaDeviceSynchronize() != cudaSuccess) throw tk::Error("the kernel failed (cudaDeviceSynchronize)");
    std::vector<uint16_t> o(count);
    cudaMemcpy(o.data(), (void*)buffers["o"], count * 2, cudaMemcpyDeviceToHost);
    Outcome result;
    result.nonfinite = count_nonfinite(o, bf16);
    result.tolerance = bf16 ? 3e-2 : 4e-3;
    double diff_sq = 0.0, ref_sq = 0.0;
    std::vector<long long> rows;
    for (long long r = 0; r < S; ++r)
        if (r < 4 || r >= S - 4 || r % (S / 8 + 1) == 3) rows.push_back(r);
    for (long long head : {0LL, B * H - 1}) {
        const size_t base = (size_t)(head * S * D);
        for (long long r : rows) {
            std::vector<double> score(S);
            double top = -INFINITY;
            long long keys = causal ? r + 1 : S;
            for (long long j = 0; j < keys; ++j) {
                double dot = 0.0;
                for (long long c = 0; c < D; ++c)
                    dot += from_bits(q[base + r * D + c], bf16) * from_bits(k[base + j * D + c], bf16);
                score[j] = dot / std::sqrt((double)D);
                top = std::max(top, score[j]);
            }
            double total = 0.0;
            for (long long j = 0; j < keys; ++j) total += (score[j] = std::exp(score[j] - top));
            for (long long c = 0; c < D; ++c) {
                double ref = 0.0;
                for (long long j = 0; j < keys; ++j) ref += score[j] / total * from_bits(v[base + j * D + c], bf16);
                double got = from_bits(o[base + r * D + c], bf16);
                diff_sq += (got - ref) * (got - ref);
                ref_sq += ref * ref;
            }
        }
    }
    result.error = std::sqrt(diff_sq / ref_sq);
    return result;
}
#else
static Outcome run_family(const tk::Problem& p) {
    const long long M = p.shape[0], N = p.shape[1], K = p.shape[2];
    const bool bf16 = bf16_type(p), a_t = p.flag("layout")[0] == 't', b_t = p.flag("layout")[1] == 't';
    const std::string epilogue = p.flag("epilogue");
    std::vector<uint16_t> a = normal((size_t)(M * K), bf16, 1), b = normal((size_t)(K * N), bf16, 2);
    std::vector<uint16_t> bias = normal((size_t)N, bf16, 3, std::sqrt((double)K));
    Device dev;
    std::map<std::string, CUdeviceptr> buffers = {{"a", dev.upload("a", a)}, {"b", dev.upload("b", b)},
                                                  {"c", dev.poisoned("c", (size_t)(M * N))}};
    if (epilogue != "none") buffers["bias"] = dev.upload("bias", bias);
    tk::run(p, buffers, nullptr);
    if (cudaDeviceSynchronize() != cudaSuccess) throw tk::Error("the kernel failed (cudaDeviceSynchronize)");
    std::vector<uint16_t> c((size_t)(M * N));
    cudaMemcpy(c.data(), (void*)buffers["c"], c.size() * 2, cudaMemcpyDeviceToHost);
    Outcome result;
    result.nonfinite = count_nonfinite(c, bf16);
    result.tolerance = (bf16 ? 8e-3 : 1e-3) * std::max(1.0, std::sqrt((double)K / 4096.0));
    double diff_sq = 0.0, ref_sq = 0.0;
    std::vector<double> b_cols((size_t)(K * N));  // B as N columns of K, in double
    for (long long x = 0; x < K; ++x)
        for (long long col = 0; col < N; ++col)
            b_cols[col * K + x] = from_bits(b[b_t ? col * K + x : x * N + col], bf16);
    std::vector<double> a_row((size_t)K);
    for (long long i = 0; i < 16; ++i) {
        long long r = i < 8 ? std::min(i, M - 1) : std::max(0LL, M - 16 + i);
        for (long long x = 0; x < K; ++x) a_row[x] = from_bits(a[a_t ? x * M + r : r * K + x], bf16);
        for (long long col = 0; col < N; ++col) {
            double ref = 0.0;
            for (long long x = 0; x < K; ++x) ref += a_row[x] * b_cols[col * K + x];
            if (epilogue != "none") ref += from_bits(bias[col], bf16);
            if (epilogue == "bias_relu") ref = std::max(ref, 0.0);
            if (epilogue == "bias_gelu") ref = 0.5 * ref * (1.0 + std::erf(ref / std::sqrt(2.0)));
            if (epilogue == "bias_gelu_tanh")
                ref = 0.5 * ref * (1.0 + std::tanh(0.7978845608028654 * (ref + 0.044715 * ref * ref * ref)));
            double got = from_bits(c[r * N + col], bf16);
            diff_sq += (got - ref) * (got - ref);
            ref_sq += ref * ref;
        }
    }
    result.error = std::sqrt(diff_sq / ref_sq);
    return result;
}
#endif

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: %s pick|compile|run SHAPE DTYPE [FLAG=VALUE ...]\n", argv[0]);
        return 2;
    }
    const std::string mode = argv[1];
    try {
        tk::Problem problem = parse(argc, argv);
        if (mode == "pick") {
            tk::Pick chosen = tk::pick(problem);
            std::printf("{%s, \"plan\": %s}\n", pick_json(chosen).c_str(), plan_json(tk::plan(problem, chosen)).c_str());
            return 0;
        }
        if (mode == "compile") {  // NVRTC on the pick's source, as run() would (no GPU needed)
            tk::Pick chosen = tk::pick(problem);
            std::vector<char> cubin = tk::compile(tk::table::KERNELS[chosen.kernel].source);
            std::printf("{%s, \"cubin_bytes\": %zu}\n", pick_json(chosen).c_str(), cubin.size());
            return 0;
        }
        tk::Pick chosen = tk::pick(problem);
        Outcome out = run_family(problem);
        bool ok = out.nonfinite == 0 && out.error <= out.tolerance;
        std::printf("{%s, \"ok\": %s, \"error\": %.6g, \"tolerance\": %.3g, \"nonfinite\": %lld}\n",
                    pick_json(chosen).c_str(), ok ? "true" : "false", out.error, out.tolerance, out.nonfinite);
        return ok ? 0 : 1;
    } catch (const std::exception& error) {
        std::printf("{\"error\": %s}\n", quote(error.what()).c_str());
        return 3;
    }
}
