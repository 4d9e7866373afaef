// Microbenchmarks behind the GPU spec values marked "gpu_probes.cu" (hwspecs/*.toml): the
// latency of a load that hits L1, L2 and shared memory, and how many warp load instructions and
// bytes per SM cycle the L1 / shared-memory path serves, alone and mixed as aotune's kernels
// mix them (shared-memory LDS.128 beside global LDG.32 that hit L1).
//
//   nvcc -O3 -arch=sm_90 -o gpu_probes hwspecs/gpu_probes.cu && ./gpu_probes
//   ./gpu_probes patterns    # the access-pattern table alone
//   ./gpu_probes bandwidth   # the L2 and DRAM read sweeps alone
//
// Every figure is in SM cycles (clock64 inside the kernel), so it does not depend on the clock
// the card holds. Every value loaded feeds a sum that is stored, so no load is dead.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(x)                                                                 \
    do {                                                                         \
        cudaError_t e_ = (x);                                                    \
        if (e_ != cudaSuccess) {                                                 \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

// How every timed kernel ends: the block's cycles since ``t0``, once all its threads are done,
// and a store of what it loaded that no compiler can prove dead.
__device__ void block_cycles(long long t0, float total, long long *cycles, float *sink) {
    __syncthreads();
    long long t1 = clock64();
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
    if (total == 12345.f) sink[threadIdx.x] = total;
}

// Pointer chase: one thread, each load's address is the previous load's value.
__global__ void chase_global(const unsigned long long *start, int hops, long long *cycles,
                             unsigned long long *sink) {
    const unsigned long long *p = start;
    // a ring: warm it once round, then time ``hops`` from wherever that ended
    for (int i = 0; i < 64; ++i) p = (const unsigned long long *)__ldca(p);
    long long t0 = clock64();
    for (int i = 0; i < hops; ++i) p = (const unsigned long long *)__ldca(p);
    long long t1 = clock64();
    *cycles = t1 - t0;
    *sink = (unsigned long long)p;
}

__global__ void chase_shared(int hops, long long *cycles, unsigned *sink) {
    __shared__ unsigned ring[256];
    for (int i = 0; i < 256; ++i) ring[i] = (unsigned)__cvta_generic_to_shared(&ring[(i + 33) % 256]);
    __syncthreads();
    unsigned a = (unsigned)__cvta_generic_to_shared(&ring[0]);
    long long t0 = clock64();
    for (int i = 0; i < hops; ++i) asm volatile("ld.shared.u32 %0, [%0];" : "+r"(a));
    long long t1 = clock64();
    *cycles = t1 - t0;
    *sink = a;
}

// Throughput: every warp of one block per SM loads in an unrolled loop. mode: 0 LDG.32,
// 1 LDG.128, 2 LDS.32, 3 LDS.128, 4 per step 1 LDS.128 and 4 LDG.32 (aotune's mix: A's vector
// from shared memory, B's scalars from global), 5 LDS.128 + LDG.128. Plain C++ loads (LDG.E,
// cached in L1 as aotune's are); ``flip`` is 1 at run time, so no address is loop-invariant or
// provably equal to another and every load stays in the code (checked in the SASS).
template <int MODE>
__global__ void throughput(const float *buf, int iters, int flip, long long *cycles,
                           float *sink) {
    __shared__ __align__(16) float tile[8192];
    for (int i = threadIdx.x; i < 8192; i += blockDim.x) tile[i] = buf[i];
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wide = (MODE == 1 || MODE == 5) ? 4 : 1;  // floats per global load
    const int swide = (MODE == 3 || MODE >= 4) ? 4 : 1;  // floats per shared load
    const int g0 = (warp & 15) * 128 + lane * wide;      // a warp: 128 or 512 B in a row
    const int s0 = (warp & 3) * 128 + lane * swide;
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;  // four sums: no FADD chain holds loads up
    long long t0 = clock64();
    for (int it = 0; it < iters; ++it) {
        const int gb = g0 + ((it & flip) << 5), sb = s0 ^ ((it & flip) << 9);
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const float *g = buf + gb + u * 2048;  // 8 KB apart: 64 KB in all, inside L1
            const int si = (sb + u * 1024) & 8191;
            if (MODE == 0) a0 += g[0];
            if (MODE == 1) {
                float4 v = *(const float4 *)g;
                a0 += v.x, a1 += v.y, a2 += v.z, a3 += v.w;
            }
            if (MODE == 2) a0 += tile[si];
            if (MODE == 3 || MODE >= 4) {
                float4 v = *(const float4 *)&tile[si];
                a0 += v.x, a1 += v.y, a2 += v.z, a3 += v.w;
            }
            if (MODE == 4) a0 += g[0], a1 += g[512], a2 += g[1024], a3 += g[1536];
            if (MODE == 5) {
                float4 v = *(const float4 *)g;
                a0 += v.x, a1 += v.y, a2 += v.z, a3 += v.w;
            }
        }
    }
    block_cycles(t0, a0 + a1 + a2 + a3, cycles, sink);
}

// Access patterns: lane l of every warp reads WIDTH floats at (l % distinct) * stride floats, from
// global memory (hitting L1) or from shared memory. What one warp instruction costs the SM's
// L1 / shared-memory path, in cycles, says by which rule its wavefronts are counted (banks in
// quarter-warp phases, 128-byte lines or 32-byte sectors): the rule gpu_model.py applies.
template <int WIDTH, bool SHARED>
__global__ void pattern(const float *buf, int iters, int flip, int stride, int distinct,
                        long long *cycles, float *sink) {
    __shared__ __align__(16) float tile[SHARED ? 8192 : 4];
    if (SHARED) {
        for (int i = threadIdx.x; i < 8192; i += blockDim.x) tile[i] = buf[i];
        __syncthreads();
    }
    const int off0 = ((threadIdx.x & 31) % distinct) * stride;
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
    long long t0 = clock64();
    for (int it = 0; it < iters; ++it) {
        const int base = off0 + ((it & flip) << 5);  // 128 B on: same banks, same line offsets
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int i = base + u * (SHARED ? 1024 : 2048);
            const float *src = SHARED ? tile + i : buf + i;
            if (WIDTH == 1) a0 += src[0];
            if (WIDTH == 2) {
                float2 v = *(const float2 *)src;
                a0 += v.x, a1 += v.y;
            }
            if (WIDTH == 4) {
                float4 v = *(const float4 *)src;
                a0 += v.x, a1 += v.y, a2 += v.z, a3 += v.w;
            }
        }
    }
    block_cycles(t0, a0 + a1 + a2 + a3, cycles, sink);
}

// Bandwidth of the L2 (or DRAM, for a footprint larger than the L2): every thread of every block
// reads 16 B at a time through L2 only (ld.global.cg: L1 keeps nothing), sweeping the footprint
// ``passes`` times, consecutive threads on consecutive 16 B, four loads in flight per thread.
__global__ void sweep(const float4 *buf, long long n, int passes, long long *cycles, float *sink) {
    float a = 0.f;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long t0 = clock64();
    for (int p = 0; p < passes; ++p)
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i + 3 * stride < n;
             i += 4 * stride) {
            float4 v0 = __ldcg(buf + i), v1 = __ldcg(buf + i + stride);
            float4 v2 = __ldcg(buf + i + 2 * stride), v3 = __ldcg(buf + i + 3 * stride);
            a += (v0.x + v0.y + v0.z + v0.w) + (v1.x + v1.y + v1.z + v1.w) +
                 (v2.x + v2.y + v2.z + v2.w) + (v3.x + v3.y + v3.z + v3.w);
        }
    block_cycles(t0, a, cycles, sink);
}

// The slowest block's cycles of the last launch (``cycles``: one per block, on the device).
static long long slowest_block(const long long *cycles, int blocks) {
    long long *h = (long long *)malloc(blocks * 8);
    CHECK(cudaMemcpy(h, cycles, blocks * 8, cudaMemcpyDeviceToHost));
    long long worst = 0;
    for (int i = 0; i < blocks; ++i) worst = h[i] > worst ? h[i] : worst;
    free(h);
    return worst;
}

static double run_chase(size_t footprint, size_t stride, int hops, bool shuffle) {
    size_t n = footprint / stride, words = footprint / 8;
    unsigned long long *d;
    CHECK(cudaMalloc(&d, footprint));
    unsigned long long *h = (unsigned long long *)calloc(words, 8);
    size_t *order = (size_t *)malloc(n * sizeof(size_t));
    for (size_t i = 0; i < n; ++i) order[i] = i;
    if (shuffle) {
        srand(1);
        for (size_t i = n - 1; i > 0; --i) {
            size_t j = (size_t)rand() % (i + 1), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
    }
    for (size_t i = 0; i < n; ++i)
        h[order[i] * stride / 8] = (unsigned long long)(d + order[(i + 1) % n] * stride / 8);
    CHECK(cudaMemcpy(d, h, footprint, cudaMemcpyHostToDevice));
    long long *cyc;
    unsigned long long *sink;
    CHECK(cudaMalloc(&cyc, 8));
    CHECK(cudaMalloc(&sink, 8));
    chase_global<<<1, 1>>>(d + order[0] * stride / 8, hops, cyc, sink);  // warm-up run
    chase_global<<<1, 1>>>(d + order[0] * stride / 8, hops, cyc, sink);
    CHECK(cudaDeviceSynchronize());
    long long c;
    CHECK(cudaMemcpy(&c, cyc, 8, cudaMemcpyDeviceToHost));
    cudaFree(d), cudaFree(cyc), cudaFree(sink), free(h), free(order);
    return (double)c / hops;
}

template <int MODE>
static void run_throughput(const char *name, int sms, int threads, double loads_per_step,
                           double bytes_per_step) {
    float *buf, *sink;
    long long *cyc;
    CHECK(cudaMalloc(&buf, 64 << 20));
    CHECK(cudaMemset(buf, 0, 64 << 20));
    CHECK(cudaMalloc(&sink, 4096 * 4));
    CHECK(cudaMalloc(&cyc, sms * 8));
    const int iters = 4096;
    throughput<MODE><<<sms, threads>>>(buf, 64, 1, cyc, sink);  // warm L1 and the code
    throughput<MODE><<<sms, threads>>>(buf, iters, 1, cyc, sink);
    CHECK(cudaDeviceSynchronize());
    const long long worst = slowest_block(cyc, sms);
    double warps = threads / 32.0, steps = (double)iters * 8;
    double instr = warps * steps * loads_per_step / worst;
    double bytes = warps * 32 * steps * bytes_per_step / worst;
    printf("%-34s warps/SM %2.0f: %.3f warp load instructions and %.1f B per SM cycle\n", name,
           warps, instr, bytes);
    cudaFree(buf), cudaFree(sink), cudaFree(cyc);
}

template <int WIDTH, bool SHARED>
static void run_pattern(int sms, int stride, int distinct, int iters) {
    float *buf, *sink;
    long long *cyc;
    CHECK(cudaMalloc(&buf, 1 << 20));
    CHECK(cudaMemset(buf, 0, 1 << 20));
    CHECK(cudaMalloc(&sink, 4096 * 4));
    CHECK(cudaMalloc(&cyc, sms * 8));
    const int threads = 1024;
    pattern<WIDTH, SHARED><<<sms, threads>>>(buf, 16, 1, stride, distinct, cyc, sink);
    pattern<WIDTH, SHARED><<<sms, threads>>>(buf, iters, 1, stride, distinct, cyc, sink);
    CHECK(cudaDeviceSynchronize());
    const long long worst = slowest_block(cyc, sms);
    const double instr = threads / 32.0 * iters * 8;
    printf("pattern %s.%-3d stride %3d B, %2d distinct lanes: %6.2f cycles per warp instruction\n",
           SHARED ? "LDS" : "LDG", 32 * WIDTH, 4 * stride, distinct, worst / instr);
    cudaFree(buf), cudaFree(sink), cudaFree(cyc);
}

template <int WIDTH, bool SHARED>
static void run_patterns(int sms, int iters) {
    for (int distinct : {32, 16, 8, 1})
        for (int mult : {1, 2, 4, 8})  // the shared tile holds lanes up to 64 B apart
            if (!SHARED || WIDTH * mult <= 16)
                run_pattern<WIDTH, SHARED>(sms, WIDTH * mult, distinct, iters);
    if (WIDTH == 1 && !SHARED)  // a line per lane (the shared tile is too small for this stride)
        for (int distinct : {32, 16}) run_pattern<WIDTH, SHARED>(sms, 32, distinct, iters);
}

static void run_sweep(int blocks, int threads, size_t footprint, int passes, const char *who) {
    float4 *buf;
    float *sink;
    long long *cyc;
    CHECK(cudaMalloc(&buf, footprint));
    CHECK(cudaMemset(buf, 0, footprint));
    CHECK(cudaMalloc(&sink, 4096 * 4));
    CHECK(cudaMalloc(&cyc, blocks * 8));
    const long long n = footprint / 16;
    sweep<<<blocks, threads>>>(buf, n, 1, cyc, sink);  // bring the footprint into L2
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    CHECK(cudaEventRecord(e0));
    sweep<<<blocks, threads>>>(buf, n, passes, cyc, sink);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    const long long worst = slowest_block(cyc, blocks);
    const double bytes = (double)footprint * passes;
    printf("read bandwidth, %5zu MiB footprint (ld.global.cg), %s: %7.0f GB/s, %6.1f B per SM-clock "
           "cycle\n", footprint >> 20, who, bytes / (ms * 1e6), bytes / worst);
    cudaFree(buf), cudaFree(sink), cudaFree(cyc);
}

int main(int argc, char **argv) {
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    printf("%s, sm_%d%d, %d SMs, L2 %d KiB\n", p.name, p.major, p.minor, p.multiProcessorCount,
           p.l2CacheSize / 1024);
    printf("latency, L1 hit (4 KiB ring, 128 B apart):    %.1f cycles\n",
           run_chase(4096, 128, 4096, false));
    printf("latency, L2 hit (16 MiB ring, 128 B, random): %.1f cycles\n",
           run_chase(16 << 20, 128, 16384, true));
    printf("latency, DRAM (256 MiB ring, 4 KiB apart, random): %.1f cycles\n",
           run_chase(256ull << 20, 4096, 8192, true));
    {
        long long *cyc;
        unsigned *sink;
        CHECK(cudaMalloc(&cyc, 8));
        CHECK(cudaMalloc(&sink, 4));
        chase_shared<<<1, 1>>>(4096, cyc, sink);
        chase_shared<<<1, 1>>>(4096, cyc, sink);
        long long c;
        CHECK(cudaMemcpy(&c, cyc, 8, cudaMemcpyDeviceToHost));
        printf("latency, shared memory (LDS.32):             %.1f cycles\n", c / 4096.0);
        cudaFree(cyc), cudaFree(sink);
    }
    const int sms = p.multiProcessorCount;
    if (argc > 1 && argv[1][0] == 'b') {  // "bandwidth": the L2 and DRAM sweeps alone
        // 512 x 256 threads: every SM full, 2 MiB per step of the sweep (footprints in 8 MiB)
        for (size_t mib : {8, 16, 24, 32, 40}) run_sweep(512, 256, mib << 20, 64, "all SMs");
        run_sweep(512, 256, (size_t)2048 << 20, 4, "all SMs");
        run_sweep(1, 1024, 8 << 20, 8, "one SM");  // what one SM's L1 can take from the L2
        run_sweep(2, 1024, 8 << 20, 8, "one block on each of 2 SMs");
        return 0;
    }
    if (argc > 1) {  // "patterns [iters]": the access-pattern table alone (short, for ncu too)
        const int iters = argc > 2 ? atoi(argv[2]) : 1024;
        run_patterns<1, false>(sms, iters), run_patterns<2, false>(sms, iters);
        run_patterns<4, false>(sms, iters), run_patterns<1, true>(sms, iters);
        run_patterns<2, true>(sms, iters), run_patterns<4, true>(sms, iters);
        return 0;
    }
    for (int threads : {256, 1024}) {
        run_throughput<0>("LDG.32, L1 hit, coalesced", sms, threads, 1, 4);
        run_throughput<1>("LDG.128, L1 hit, coalesced", sms, threads, 1, 16);
        run_throughput<2>("LDS.32, no conflict", sms, threads, 1, 4);
        run_throughput<3>("LDS.128, no conflict", sms, threads, 1, 16);
        run_throughput<4>("1 LDS.128 + 4 LDG.32 (L1 hit)", sms, threads, 5, 32);
        run_throughput<5>("1 LDS.128 + 1 LDG.128 (L1 hit)", sms, threads, 2, 32);
    }
    return 0;
}
