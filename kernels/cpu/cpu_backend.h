/* cpu_backend.h - the CPU backend's entry for the registry (kernels/registry.c). */
#ifndef RD_CPU_BACKEND_H
#define RD_CPU_BACKEND_H

#include "engine/backend.h"

/* The "cpu" backend: n_threads pool threads (0: one per online core). */
int rd_backend_cpu_create(int n_threads, rd_backend **out);

#endif
