#include <stdio.h>
#include <math.h>
#include "alpha_kernels.h"
#include "beta_kernels.h"
static float A1[33*29], B1[29*17], C1[33*17], A2[31*23], B2[23*19], C2[31*19];
static double check(const float *A, const float *B, const float *C, int M, int N, int K) {
  double worst = 0;
  for (int m = 0; m < M; m++) for (int n = 0; n < N; n++) {
    double s = 0; for (int k = 0; k < K; k++) s += (double)A[m*K+k] * B[k*N+n];
    double e = fabs(s - C[m*N+n]); if (e > worst) worst = e; }
  return worst;
}
int main(void) {
  for (int i = 0; i < 33*29; i++) A1[i] = (i % 7) * 0.25f - 0.5f;
  for (int i = 0; i < 29*17; i++) B1[i] = (i % 5) * 0.5f - 1.0f;
  for (int i = 0; i < 31*23; i++) A2[i] = (i % 3) * 0.5f - 0.5f;
  for (int i = 0; i < 23*19; i++) B2[i] = (i % 11) * 0.125f - 0.5f;
  if (alpha_set_num_threads(2) != ALPHA_OK || beta_set_num_threads(1) != BETA_OK) return 3;
  int ra = mm_a(A1, B1, C1), rb = mm_b(A2, B2, C2);
  printf("%d %d %s | %s | %d %d\n", ra, rb, alpha_strerror(ra), beta_strerror(ALPHA_ERR_NULL),
         alpha_get_num_threads(), beta_get_num_threads());
  double ea = check(A1, B1, C1, 33, 17, 29), eb = check(A2, B2, C2, 31, 19, 23);
  alpha_shutdown(); beta_shutdown();
  printf("err %g %g\n", ea, eb);
  return (ea < 1e-4 && eb < 1e-4) ? 0 : 1;
}
