// cuemu.cc - the host emulation of CUDA (see cuemu.h). Tests only.
#include "kernels/cuda/cuemu.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define CUEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUEMU_ASAN 1
#endif
#endif
#ifdef CUEMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace cuemu {

[[noreturn]] static void die(const char *what)
{
    std::fprintf(stderr, "cuemu: %s\n", what);
    std::fflush(stderr);
    std::abort();
}

// ---------------------------------------------------------------- fibers

enum { F_RUN, F_BLOCK_BAR, F_WARP_BAR, F_DONE };

#ifdef __x86_64__
// Saves the callee-saved registers and the stack pointer in *from, loads to.
extern "C" void cuemu_switch(void **from, void *to);
asm(R"(
    .text
    .globl cuemu_switch
    .type cuemu_switch,@function
cuemu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cuemu_switch, .-cuemu_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
#endif

// A cp.async in flight: its bytes, read at the issue (the source is global memory no kernel writes while
// it reads it), written to dst when its group is waited for.
struct cp_copy {
    unsigned char *dst;
    unsigned char data[16];
    unsigned bytes;
    int group;                  // -1: not yet committed
};

// A wgmma.mma_async in flight (m64nNk16, bf16, A from registers, B from shared memory): run when its group is
// waited for, so B is read then and d written then, as on a GPU where neither may be touched before the wait.
struct wg_op {
    float *d;                   // the thread's N / 2 accumulators
    unsigned n;                 // N
    uint32_t a[4];              // the thread's A fragment (read at the issue)
    const uint32_t *a_regs;     // its registers, which must hold it until the wait
    uint64_t desc;              // B's descriptor
    int group;                  // -1: not yet committed
};

struct fiber {
    cuemu_uint3 tid;
    unsigned lin;               // linear thread index in the block
    int state;
    unsigned phase;             // warp exchanges done (selects the slot)
    std::vector<cp_copy> cps;   // cp.async copies not yet landed
    int cp_groups;              // groups committed so far
    std::vector<wg_op> wgs;     // wgmma operations not yet waited for
    int wg_groups;              // wgmma groups committed so far
    bool async_unfenced;        // shared-memory stores for the tensor cores since the last fence.proxy.async
    char *stack;
    size_t stack_size;
#ifdef __x86_64__
    void *sp;
#else
    ucontext_t ctx;
#endif
};

fiber *cur;
cuemu_uint3 block_idx;
dim3 block_dim, grid_dim;

static const size_t STACK = 320 * 1024; // 256 KiB for a fiber's frames, below its stagger (fiber_init)
static std::vector<fiber> fibers;
static std::vector<uint64_t> xch(2 * 1024);
static const size_t SMEM_DEFAULT = 48 * 1024, SMEM_OPTIN = 227 * 1024; // an H100's per-block limits
static std::vector<unsigned char> smem_buf(SMEM_OPTIN);
static size_t launch_smem;              // the running launch's dynamic shared memory
static std::map<const void *, size_t> smem_optin; // cudaFuncSetAttribute(MaxDynamicSharedMemorySize)
static const std::function<void()> *body;
static std::mutex launch_mu;            // one launch at a time, whatever the thread
#ifdef __x86_64__
static void *sched_sp;
#else
static ucontext_t sched_ctx;
#endif
#ifdef CUEMU_ASAN
static const void *main_stack_bottom;
static size_t main_stack_size;
#endif
static uint64_t n_launches;
static uint64_t n_syncs;        // cudaStreamSynchronize / cudaDeviceSynchronize calls (the host's waits)

const cuemu_uint3 &thread_idx()
{
    if (!cur)
        die("threadIdx read outside a kernel");
    return cur->tid;
}

unsigned lane_id() { return cur->lin % 32; }
unsigned char *dyn_smem() { return smem_buf.data(); }

static void to_scheduler(int exiting)
{
#ifdef CUEMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(exiting ? nullptr : &fake, main_stack_bottom, main_stack_size);
#else
    (void)exiting;
#endif
#ifdef __x86_64__
    cuemu_switch(&cur->sp, sched_sp);
#else
    swapcontext(&cur->ctx, &sched_ctx);
#endif
#ifdef CUEMU_ASAN
    __sanitizer_finish_switch_fiber(fake, &main_stack_bottom, &main_stack_size);
#endif
}

static void cp_land(fiber *f, int before_group)
{
    size_t keep = 0;
    for (size_t i = 0; i < f->cps.size(); i++) {
        cp_copy &c = f->cps[i];
        if (c.group >= 0 && c.group < before_group)
            std::memcpy(c.dst, c.data, c.bytes);
        else
            f->cps[keep++] = c;
    }
    f->cps.resize(keep);
}

static uint64_t n_cp_async; // cp.async copies issued (test hook: which form of a kernel ran)

void cp_async(void *dst, const void *src, unsigned bytes, unsigned src_bytes)
{
    if (!cur)
        die("cp.async outside a kernel");
    unsigned char *d = (unsigned char *)dst;
    if (bytes > 16 || src_bytes > bytes || d < smem_buf.data() || d + bytes > smem_buf.data() + launch_smem ||
        (uintptr_t)d % bytes || (uintptr_t)src % bytes)
        die("cp.async: not an aligned copy of at most 16 bytes into the launch's dynamic shared memory");
    n_cp_async++;
    cp_copy c{d, {}, bytes, -1};
    std::memcpy(c.data, src, src_bytes);
    std::memset(d, 0xff, bytes);
    cur->cps.push_back(c);
}

// The thread's uncommitted operations (group -1) become group `groups`, the next.
template <class T> static void commit_group(std::vector<T> &ops, int &groups)
{
    for (T &o : ops)
        if (o.group < 0)
            o.group = groups;
    groups++;
}

void cp_async_commit()
{
    if (!cur)
        die("cp.async.commit_group outside a kernel");
    commit_group(cur->cps, cur->cp_groups);
}

void cp_async_wait(unsigned newest)
{
    if (!cur)
        die("cp.async.wait_group outside a kernel");
    cp_land(cur, cur->cp_groups - (int)newest);
}

static void fiber_main()
{
#ifdef CUEMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &main_stack_bottom, &main_stack_size);
#endif
    (*body)();
    if (!cur->cps.empty())
        die("a thread returned with cp.async copies it never waited for");
    if (!cur->wgs.empty())
        die("a thread returned with wgmma operations it never waited for");
    cur->state = F_DONE;
    to_scheduler(1);
    die("a finished fiber was resumed");
}

static void fiber_init(fiber *f)
{
    if (!f->stack) {
        void *p = mmap(nullptr, STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            die("cannot map a fiber stack");
        f->stack = (char *)p;
        f->stack_size = STACK;
    }
#ifdef CUEMU_ASAN
    // A fiber never returns from fiber_main: its frames' redzones stay
    // poisoned until the stack is reused here.
    __asan_unpoison_memory_region(f->stack, f->stack_size);
#endif
#ifdef __x86_64__
    // Frame popped by cuemu_switch: r15..rbp, return address; after the ret,
    // rsp = top - 8, as at the entry of a called function.
    // Each fiber's frames start at its own offset (256 B apart, over 64 KiB):
    // stacks STACK apart whose tops were all aligned alike would put every
    // fiber's hot frames in the same cache sets, and a barrier round trip
    // through hundreds of fibers would miss at each switch.
    size_t stagger = (size_t)((f - fibers.data()) % 256) * 256;
    uintptr_t top = ((uintptr_t)(f->stack + f->stack_size - stagger)) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 64);
    for (int i = 0; i < 6; i++)
        sp[i] = 0;
    sp[6] = (uint64_t)(uintptr_t)&fiber_main;
    sp[7] = 0;                  // fiber_main's (never used) return address
    f->sp = sp;
#else
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = f->stack;
    f->ctx.uc_stack.ss_size = f->stack_size;
    f->ctx.uc_link = nullptr;
    makecontext(&f->ctx, (void (*)())fiber_main, 0);
#endif
    f->state = F_RUN;
    f->phase = 0;
    f->cps.clear();
    f->cp_groups = 0;
    f->wgs.clear();
    f->wg_groups = 0;
    f->async_unfenced = false;
}

static void run_fiber(fiber *f)
{
    cur = f;
#ifdef CUEMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, f->stack_size);
#endif
#ifdef __x86_64__
    cuemu_switch(&sched_sp, f->sp);
#else
    swapcontext(&sched_ctx, &f->ctx);
#endif
#ifdef CUEMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    cur = nullptr;
}

void smem_async_write()
{
    if (!cur)
        die("a store for wgmma outside a kernel");
    cur->async_unfenced = true;
}

void fence_proxy_async()
{
    if (!cur)
        die("fence.proxy.async outside a kernel");
    cur->async_unfenced = false;
}

void syncthreads()
{
    if (!cur)
        die("__syncthreads outside a kernel");
    if (cur->async_unfenced)
        die("a barrier after shared-memory stores for wgmma without fence.proxy.async");
    cur->state = F_BLOCK_BAR;
    to_scheduler(0);
}

// Two exchange slots per thread, used alternately: a lane can write the next
// exchange's slot while slower lanes still read this one's, and it cannot get
// two exchanges ahead, because the next barrier waits for every lane. So one
// barrier per exchange suffices.
uint64_t warp_exchange(uint64_t v, unsigned src_lane)
{
    if (!cur)
        die("warp operation outside a kernel");
    fiber *me = cur;
    unsigned base = me->lin - me->lin % 32, ph = me->phase++ & 1;
    xch[2 * me->lin + ph] = v;
    me->state = F_WARP_BAR;
    to_scheduler(0);
    unsigned src = base + src_lane;
    if (src >= block_dim.x * block_dim.y * block_dim.z)
        die("shuffle from a lane past the end of the block");
    return xch[2 * src + ph];
}

// The same two-slot scheme as warp_exchange, over a byte area per lane.
static std::vector<unsigned char> xg(2 * 1024 * 64);

void warp_allgather(const void *mine, unsigned bytes, void *all)
{
    if (!cur)
        die("warp operation outside a kernel");
    if (bytes > 64)
        die("warp_allgather of more than 64 bytes");
    fiber *me = cur;
    unsigned base = me->lin - me->lin % 32, ph = me->phase++ & 1;
    if (base + 32 > block_dim.x * block_dim.y * block_dim.z)
        die("warp_allgather in a partial warp");
    std::memcpy(&xg[(2 * (size_t)me->lin + ph) * 64], mine, bytes);
    me->state = F_WARP_BAR;
    to_scheduler(0);
    for (unsigned l = 0; l < 32; l++)
        std::memcpy((unsigned char *)all + (size_t)l * bytes, &xg[(2 * (size_t)(base + l) + ph) * 64], bytes);
}

// B's element (k, col) of a K-major, unswizzled operand (PTX ISA, "Shared Memory Matrix Layout": core
// matrices of 8 rows of 16 bytes, LBO from one core matrix to the next along K, SBO along N).
static float wg_b(uint64_t desc, unsigned k, unsigned col)
{
    const size_t start = (size_t)(desc & 0x3fffu) << 4, lbo = (size_t)(desc >> 16 & 0x3fffu) << 4,
                 sbo = (size_t)(desc >> 32 & 0x3fffu) << 4;
    const size_t off = start + (col % 8) * 16 + (col / 8) * sbo + (k % 8) * 2 + (k / 8) * lbo;
    if (off + 2 > launch_smem)
        die("wgmma: B reaches past the launch's dynamic shared memory");
    uint16_t h;
    std::memcpy(&h, smem_buf.data() + off, 2);
    const uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

static uint64_t n_wgmma; // wgmma operations run (test hook: a kernel meant to use them did)

static void wg_run(const wg_op &op)
{
    n_wgmma++;
    if (std::memcmp(op.a, op.a_regs, sizeof op.a))
        die("wgmma: A's registers were written before the wait for its operation");
    uint32_t all[32][4];
    warp_allgather(op.a, sizeof op.a, all);
    auto lo = [](uint32_t v) { uint32_t u = v << 16; float f; std::memcpy(&f, &u, 4); return f; };
    auto hi = [](uint32_t v) { uint32_t u = v & 0xffff0000u; float f; std::memcpy(&f, &u, 4); return f; };
    const unsigned lane = cur->lin % 32, g = lane / 4, t = lane % 4;
    float A[2][16]; // rows g and g + 8 of the warp's 16
    for (unsigned tt = 0; tt < 4; tt++) {
        const uint32_t *f = all[4 * g + tt];
        A[0][2 * tt] = lo(f[0]), A[0][2 * tt + 1] = hi(f[0]), A[1][2 * tt] = lo(f[1]), A[1][2 * tt + 1] = hi(f[1]);
        A[0][2 * tt + 8] = lo(f[2]), A[0][2 * tt + 9] = hi(f[2]), A[1][2 * tt + 8] = lo(f[3]), A[1][2 * tt + 9] = hi(f[3]);
    }
    for (unsigned j = 0; j < op.n / 8; j++)
        for (unsigned i = 0; i < 4; i++) {
            const unsigned col = 8 * j + 2 * t + (i & 1);
            double s = op.d[4 * j + i];
            for (unsigned k = 0; k < 16; k++)
                s += (double)A[i / 2][k] * (double)wg_b(op.desc, k, col);
            op.d[4 * j + i] = (float)s;
        }
}

void wgmma_bf16(float *d, unsigned n, const uint32_t (&a)[4], uint64_t desc)
{
    if (!cur)
        die("wgmma outside a kernel");
    if ((block_dim.x * block_dim.y * block_dim.z) % 128)
        die("wgmma in a block that is not whole warpgroups");
    if (n % 8 || n == 0 || n > 256 || desc >> 46)
        die("wgmma: N not a multiple of 8 up to 256, or a descriptor with a base offset or swizzle");
    if (cur->async_unfenced)
        die("wgmma issued after this thread's shared-memory stores for it without fence.proxy.async");
    wg_op op{d, n, {a[0], a[1], a[2], a[3]}, a, desc, -1};
    cur->wgs.push_back(op);
}

void wgmma_commit()
{
    if (!cur)
        die("wgmma.commit_group outside a kernel");
    commit_group(cur->wgs, cur->wg_groups);
}

void wgmma_wait(unsigned newest)
{
    if (!cur)
        die("wgmma.wait_group outside a kernel");
    const int before = cur->wg_groups - (int)newest;
    size_t keep = 0; // (wg_run yields to the other fibers, which touch only their own lists)
    for (size_t i = 0; i < cur->wgs.size(); i++) {
        const wg_op o = cur->wgs[i];
        if (o.group >= 0 && o.group < before)
            wg_run(o);
        else
            cur->wgs[keep++] = o;
    }
    cur->wgs.resize(keep);
}

static void run_block(unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        fiber_init(&fibers[i]);
    }
    // Poison dynamic shared memory: reading it before writing gives NaN.
    std::memset(smem_buf.data(), 0xff, launch_smem);
    for (;;) {
        for (unsigned i = 0; i < n; i++)
            if (fibers[i].state == F_RUN)
                run_fiber(&fibers[i]);
        unsigned done = 0, at_block = 0;
        for (unsigned i = 0; i < n; i++) {
            done += fibers[i].state == F_DONE;
            at_block += fibers[i].state == F_BLOCK_BAR;
        }
        if (done == n)
            return;
        int released = 0;
        for (unsigned w = 0; w * 32 < n; w++) {
            unsigned lo = w * 32, hi = lo + 32 < n ? lo + 32 : n, waiting = 0, exited = 0, live = 0;
            for (unsigned i = lo; i < hi; i++) {
                waiting += fibers[i].state == F_WARP_BAR;
                exited += fibers[i].state == F_DONE;
                live += fibers[i].state != F_DONE;
            }
            if (waiting && waiting == live) {
                if (exited)
                    die("warp shuffle/__syncwarp while some lanes of the warp have exited");
                for (unsigned i = lo; i < hi; i++)
                    fibers[i].state = F_RUN;
                released = 1;
            }
        }
        if (released)
            continue;
        if (at_block == n - done) {
            if (done)
                die("__syncthreads reached after some threads of the block returned");
            for (unsigned i = 0; i < n; i++)
                fibers[i].state = F_RUN;
            continue;
        }
        die("deadlock: threads wait at different barriers (divergent __syncthreads or warp op)");
    }
}

static void run_grid(dim3 grid, dim3 block, const std::function<void()> &fn)
{
    unsigned n = block.x * block.y * block.z;
    if (fibers.size() < n)
        fibers.resize(n);
    for (unsigned i = 0; i < n; i++) {
        fibers[i].lin = i;
        fibers[i].tid = {i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
    }
    block_dim = block;
    grid_dim = grid;
    body = &fn;
    // Blocks in reverse order: a kernel that relies on block order shows it.
    for (unsigned z = grid.z; z-- > 0;)
        for (unsigned y = grid.y; y-- > 0;)
            for (unsigned x = grid.x; x-- > 0;) {
                block_idx = {x, y, z};
                run_block(n);
            }
    body = nullptr;
    n_launches++;
}

// ---------------------------------------------------------------- streams, graphs
//
// A stream is a queue: work enqueued on it runs only when something waits
// for it (cudaStreamSynchronize, an event wait, a copy to pageable host
// memory, cudaFree, cudaDeviceSynchronize), in order. So a missing wait or a
// read through another stream sees stale data here as it would on a GPU.
// Copies from pageable host memory are staged at the call (as CUDA does);
// pinned memory (cudaMallocHost) is read and written when the copy runs.

struct stream_t {
    int capturing;
    std::vector<std::function<void()>> *rec;
    std::vector<std::function<void()>> q;
};

static thread_local cudaError_t last_error;
static int fail_malloc;
static int capturing_streams;
static std::vector<stream_t *> streams;
static std::vector<std::pair<const char *, size_t>> pinned;

static cudaError_t set_err(cudaError_t e)
{
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

static void drain(stream_t *s)
{
    if (!s)
        return;
    // Ops may enqueue nothing themselves; take the queue first.
    std::vector<std::function<void()>> q;
    q.swap(s->q);
    for (auto &op : q)
        op();
}

static void drain_all()
{
    for (stream_t *s : streams)
        drain(s);
}

static bool is_pinned(const void *p, size_t bytes)
{
    const char *c = (const char *)p;
    for (auto &r : pinned)
        if (c >= r.first && c + bytes <= r.first + r.second)
            return true;
    return false;
}

static int enqueue(stream_t *s, std::function<void()> op)
{
    if (s && s->capturing) {
        s->rec->push_back(std::move(op));
        return 1;
    }
    if (s)
        s->q.push_back(std::move(op));
    else
        op(); // the legacy stream: at once
    return 0;
}

cudaError_t func_set_smem(const void *key, int bytes)
{
    if (bytes < 0 || (size_t)bytes > SMEM_OPTIN)
        return set_err(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> g(launch_mu);
    smem_optin[key] = (size_t)bytes;
    return cudaSuccess;
}

void launch(dim3 grid, dim3 block, size_t smem, stream_t *s, std::function<void()> fn, const char *name,
            const void *key)
{
    static const bool trace = std::getenv("CUEMU_TRACE") && !std::strcmp(std::getenv("CUEMU_TRACE"), "1");
    unsigned n = block.x * block.y * block.z;
    size_t smem_max = SMEM_DEFAULT;
    {
        std::lock_guard<std::mutex> g(launch_mu);
        auto it = key ? smem_optin.find(key) : smem_optin.end();
        if (it != smem_optin.end() && it->second > smem_max)
            smem_max = it->second;
    }
    if (n == 0 || n > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
        grid.z > 65535 || smem > smem_max) {
        std::fprintf(stderr, "cuemu: bad launch grid (%u,%u,%u) block (%u,%u,%u) smem %zu\n", grid.x, grid.y,
                     grid.z, block.x, block.y, block.z, smem);
        set_err(cudaErrorInvalidConfiguration);
        die("invalid launch configuration");
    }
    std::string label = name ? name : "?";
    if (trace && key && label == "kern") { // a launch through a variable: the symbol (the programs export theirs)
        Dl_info di;
        int st = -1;
        char *dm = dladdr(key, &di) && di.dli_sname ? abi::__cxa_demangle(di.dli_sname, nullptr, nullptr, &st) : nullptr;
        if (dm && st == 0) {
            label = dm;
            label = label.substr(0, label.find('('));
            const size_t ns = label.find("::"); // "void rdcu_emu::k_name<...>" -> "k_name<...>"
            if (ns != std::string::npos && ns < label.find('<'))
                label = label.substr(ns + 2);
        }
        std::free(dm);
    }
    enqueue(s, [grid, block, smem, fn, label]() {
        std::lock_guard<std::mutex> g(launch_mu);
        if (trace)
            std::fprintf(stderr, "cuemu: %s grid (%u,%u,%u) block %u\n", label.c_str(), grid.x, grid.y, grid.z,
                         block.x * block.y * block.z);
        launch_smem = smem;
        run_grid(grid, block, fn);
    });
}

uint64_t launches() { return n_launches; }
uint64_t syncs() { return n_syncs; }
void fail_next_malloc() { fail_malloc = 1; }

}  // namespace cuemu

// For the C tests: kernels run so far; make the next cudaMalloc fail.
extern "C" uint64_t cuemu_launch_count(void) { return cuemu::launches(); }
extern "C" uint64_t cuemu_wgmma_count(void) { return cuemu::n_wgmma; }
extern "C" uint64_t cuemu_cp_async_count(void) { return cuemu::n_cp_async; }
// ... and the host's waits for the device so far.
extern "C" uint64_t cuemu_sync_count(void) { return cuemu::syncs(); }
extern "C" void cuemu_fail_next_malloc(void) { cuemu::fail_next_malloc(); }
// For the C tests' leak checks: device allocations not yet freed.
static int64_t live_allocs;
extern "C" int64_t cuemu_live_allocs(void) { return live_allocs; }

using namespace cuemu;

struct cuemu_graph {
    std::vector<std::function<void()>> ops;
};
struct cuemu_graph_exec {
    std::vector<std::function<void()>> ops;
};
struct cuemu_event {
    double t;
    cuemu::stream_t *s;
};

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorIllegalState: return "illegal state";
    default: return "unknown error";
    }
}

cudaError_t cudaGetLastError()
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() { return last_error; }
cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int)
{
    std::memset(p, 0, sizeof *p);
    std::snprintf(p->name, sizeof p->name, "cuemu (host emulation)");
    p->totalGlobalMem = (size_t)16 << 30;
    // CUEMU_SMS: another SM count, for a test that needs a plan only a bigger GPU makes (only the plans read it)
    const char *sms = std::getenv("CUEMU_SMS");
    p->multiProcessorCount = sms && std::atoi(sms) > 0 ? std::atoi(sms) : 4;
    p->major = 9;
    p->minor = 0;
    p->sharedMemPerBlock = 48 * 1024;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    *free_b = (size_t)12 << 30;
    *total_b = (size_t)16 << 30;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize()
{
    n_syncs++;
    if (capturing_streams)
        return set_err(cudaErrorStreamCaptureUnsupported);
    drain_all();
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t bytes)
{
    *p = nullptr;
    if (capturing_streams)
        return set_err(cudaErrorStreamCaptureUnsupported);
    if (fail_malloc) {
        fail_malloc = 0;
        return set_err(cudaErrorMemoryAllocation);
    }
    // Uninitialised device memory reads as NaN-ish garbage, as on a GPU.
    void *q = std::aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    if (!q)
        return set_err(cudaErrorMemoryAllocation);
    std::memset(q, 0xff, bytes);
    *p = q;
    live_allocs++;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    if (capturing_streams)
        return set_err(cudaErrorStreamCaptureUnsupported);
    drain_all(); // cudaFree synchronises the device
    if (p)
        live_allocs--;
    std::free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    *p = std::malloc(bytes ? bytes : 1);
    if (!*p)
        return set_err(cudaErrorMemoryAllocation);
    pinned.push_back({(const char *)*p, bytes});
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p)
{
    if (!p)
        return cudaSuccess;
    drain_all();
    for (size_t i = 0; i < pinned.size(); i++)
        if (pinned[i].first == p) {
            pinned.erase(pinned.begin() + (long)i);
            break;
        }
    std::free(p);
    return cudaSuccess;
}
// The legacy default stream does not wait for non-blocking streams.
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind)
{
    if (capturing_streams)
        return set_err(cudaErrorStreamCaptureUnsupported);
    std::memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k, cudaStream_t s)
{
    const bool host_src = k == cudaMemcpyHostToDevice, host_dst = k == cudaMemcpyDeviceToHost;
    if (s && s->capturing && ((host_src && !is_pinned(src, bytes)) || (host_dst && !is_pinned(dst, bytes))))
        return set_err(cudaErrorStreamCaptureUnsupported); // pageable host copies cannot be captured
    if (host_src && !is_pinned(src, bytes)) {
        // Staged now: the caller may reuse src as soon as this returns.
        auto staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + bytes);
        enqueue(s, [dst, staged, bytes]() { std::memcpy(dst, staged->data(), bytes); });
        return cudaSuccess;
    }
    if (host_dst && !is_pinned(dst, bytes)) {
        // To pageable memory: returns when the copy is done.
        drain(s);
        std::memmove(dst, src, bytes);
        return cudaSuccess;
    }
    enqueue(s, [dst, src, bytes]() { std::memmove(dst, src, bytes); });
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *dst, int v, size_t bytes, cudaStream_t s)
{
    enqueue(s, [dst, v, bytes]() { std::memset(dst, v, bytes); });
    return cudaSuccess;
}
cudaError_t cudaMemset(void *dst, int v, size_t bytes)
{
    std::memset(dst, v, bytes);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned)
{
    *s = new stream_t{0, nullptr, {}};
    streams.push_back(*s);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s)
        return set_err(cudaErrorInvalidValue);
    if (s->capturing)
        return set_err(cudaErrorIllegalState);
    drain(s);
    for (size_t i = 0; i < streams.size(); i++)
        if (streams[i] == s) {
            streams.erase(streams.begin() + (long)i);
            break;
        }
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    n_syncs++;
    if (s && s->capturing)
        return set_err(cudaErrorStreamCaptureUnsupported);
    drain(s);
    return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode)
{
    if (!s || s->capturing)
        return set_err(cudaErrorIllegalState);
    s->capturing = 1;
    s->rec = new std::vector<std::function<void()>>();
    capturing_streams++;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    *g = nullptr;
    if (!s || !s->capturing)
        return set_err(cudaErrorIllegalState);
    s->capturing = 0;
    capturing_streams--;
    *g = new cuemu_graph{std::move(*s->rec)};
    delete s->rec;
    s->rec = nullptr;
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *st)
{
    *st = s && s->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long)
{
    *e = new cuemu_graph_exec{g->ops};
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s)
{
    if (s && s->capturing)
        return set_err(cudaErrorStreamCaptureUnsupported);
    auto ops = std::make_shared<std::vector<std::function<void()>>>(e->ops);
    enqueue(s, [ops]() {
        for (auto &op : *ops)
            op();
    });
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e)
{
    delete e;
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    delete g;
    return cudaSuccess;
}
static double now_ms()
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}
cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = new cuemu_event{0, nullptr};
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    e->t = now_ms();
    e->s = s;
    return cudaSuccess;
}
// Waits for (at least) everything enqueued on the recorded stream.
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    bool known = false;
    for (stream_t *s : streams)
        known |= s == e->s;
    if (known)
        drain(e->s);
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    *ms = (float)(b->t - a->t);
    return cudaSuccess;
}
