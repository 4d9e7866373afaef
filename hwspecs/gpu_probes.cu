// Microbenchmarks behind the GPU spec values marked "gpu_probes.cu" (hwspecs/*.toml): the
// latency of a load that hits L1, L2 and shared memory, and how many warp load instructions and
// bytes per SM cycle the L1 / shared-memory path serves, alone and mixed as aotune's kernels
// mix them (shared-memory LDS.128 beside global LDG.32 that hit L1).
//
//   nvcc -O3 -arch=sm_90 -o gpu_probes hwspecs/gpu_probes.cu && ./gpu_probes
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
    __syncthreads();
    long long t1 = clock64();
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
    const float total = a0 + a1 + a2 + a3;
    if (total == 12345.f) sink[threadIdx.x] = total;
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
    long long *h = (long long *)malloc(sms * 8);
    CHECK(cudaMemcpy(h, cyc, sms * 8, cudaMemcpyDeviceToHost));
    long long worst = 0;
    for (int i = 0; i < sms; ++i) worst = h[i] > worst ? h[i] : worst;
    double warps = threads / 32.0, steps = (double)iters * 8;
    double instr = warps * steps * loads_per_step / worst;
    double bytes = warps * 32 * steps * bytes_per_step / worst;
    printf("%-34s warps/SM %2.0f: %.3f warp load instructions and %.1f B per SM cycle\n", name,
           warps, instr, bytes);
    cudaFree(buf), cudaFree(sink), cudaFree(cyc), free(h);
}

int main() {
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
