/* clients.h - the client table and result retention (loop thread only).
 *
 * Each client (a HELLO'd client_id) has its requests, a per-client sequence
 * counter, and the finished samples it has not acknowledged yet. Retention is
 * reserved at admission with each sample's worst-case encoded size, so a
 * finished sample always has room and results are never dropped
 * (PROTOCOL.md §5, §6). Requests are also indexed by a daemon-wide key: the
 * engine's tag, which is how a finished sample finds its request. A request
 * outlives a forgotten client (BYE DISCARD, TTL) until the engine returns its
 * samples, so the unfinished count stays exact. */
#ifndef RD_DAEMON_CLIENTS_H
#define RD_DAEMON_CLIENTS_H

#include <stdint.h>

#include "base/u64map.h"
#include "daemon/serve_hist.h"
#include "engine/serve/engine.h"
#include "proto/proto.h"

typedef struct cl_client cl_client;
typedef struct cl_req cl_req;

/* One finished sample held until acknowledged. */
typedef struct cl_result {
    struct cl_result *next;     /* held list, seq increasing */
    cl_req *req;                /* alive while any of its results is held */
    eng_result er;              /* owned arrays (token ids, log-probs, ...) */
    proto_span *spans;          /* [pr.n_spans]: the engine's version spans, or &one */
    proto_span one;             /* the span [0, n_tokens) of a result without engine spans */
    proto_scores scores;        /* the prompt's scores (a scored request; pr.scores points here): arrays into er */
    proto_result pr;            /* wire view; arrays point into er */
    uint64_t bytes;             /* proto_result_bytes(&pr) */
} cl_result;

struct cl_req {
    uint64_t key;               /* daemon-wide id; the engine request's tag */
    uint64_t client_req_id;
    cl_client *client;          /* NULL once the client is forgotten: results are dropped */
    cl_req *next, *prev;        /* the client's request list */
    uint32_t n;                 /* samples */
    uint32_t n_finished;        /* samples returned by the engine */
    uint32_t n_acked;           /* samples acknowledged (or dropped) */
    uint64_t max_result_bytes;  /* reserved retention per unfinished sample */
    int aborted;                /* an abort was sent to the engine */
    uint64_t t_accept_us;       /* monotonic µs when SUBMIT accepted it */
    uint64_t seed;              /* the seed sampling used */
    uint64_t version_admit;     /* weight version at acceptance */
    uint32_t n_prompt;          /* tokens after tokenizing */
    /* Routes asked (RETURN_ROUTES): the shape its results carry them in; 0 = not asked. */
    uint16_t route_layers;
    uint8_t route_k;
    uint8_t route_width;        /* bytes per expert id on the wire (proto_route_width) */
    int serve;                  /* its SUBMIT was version 3 or later: results carry serve_dtype (RESULT_SERVE) */
    int scored;                 /* it scores its prompt (SCORE, version 5): results carry the scores (RESULT_SCORES) */
    uint32_t score_from;        /* the first prompt position scored */
    char lora[LORA_NAME_MAX];   /* the adapter it named (LORA, version 6): results carry it (RESULT_LORA); "": none */
};

struct cl_client {
    uint64_t id;
    char name[PROTO_MAX_CLIENT_NAME + 1];
    int leaving;                /* said BYE (no DISCARD): no more SUBMITs */
    uint64_t last_seq;          /* highest seq assigned */
    uint64_t ack_seq;           /* highest ack received */
    cl_result *held, *held_tail;
    uint32_t n_held;
    uint64_t held_bytes;
    uint32_t reserved;          /* unfinished samples (retention reserved for them) */
    uint64_t reserved_bytes;
    cl_req *reqs;               /* requests remembered (unfinished or not fully acked) */
    u64map by_crid;             /* client_req_id -> cl_req */
    uint64_t last_seen_us;      /* for the TTL */
    void *parked;               /* the bridge context of a parked FETCH, or NULL */
};

typedef struct {
    u64map clients;             /* client_id -> cl_client */
    u64map reqs;                /* key -> cl_req */
    uint64_t next_key;
    uint32_t n_clients;
    uint32_t unfinished;        /* requests with samples still in the engine */
    uint32_t retention_results; /* per-client bounds */
    uint64_t retention_bytes;
    const sh_hist *serve;       /* the serve_dtype of each recent version (the daemon's; NULL: none known) */
} cl_table;

void cl_init(cl_table *t, uint32_t retention_results, uint64_t retention_bytes);
void cl_free(cl_table *t);

cl_client *cl_find(cl_table *t, uint64_t id);
/* A new client with a random nonzero id not in use. */
int cl_new(cl_table *t, const char *name, uint64_t now_us, cl_client **out);
/* Forgets a client: held results dropped, finished requests freed, unfinished
 * ones orphaned until the engine returns them. */
void cl_forget(cl_table *t, cl_client *c);
/* Nothing held and nothing running. */
int cl_idle(const cl_client *c);

cl_req *cl_find_req(cl_client *c, uint64_t client_req_id);
/* 0 if n samples of up to max_bytes each fit the client's retention now,
 * else RD_EBUSY with a message. */
int cl_room(const cl_table *t, const cl_client *c, uint32_t n, uint64_t max_bytes);
/* Remembers an accepted request and reserves its retention. */
int cl_add_req(cl_table *t, cl_client *c, uint64_t client_req_id, uint32_t n, uint64_t max_bytes, cl_req **out);

/* Takes a finished sample from the engine (its arrays move into the table;
 * *er is zeroed; its routes are narrowed in place to the request's
 * route_width). Assigns the next seq. Returns the client that got it, or NULL
 * when the request's client is gone (the sample is dropped). */
cl_client *cl_finish(cl_table *t, eng_result *er, uint64_t weight_version, uint64_t t_added_us, uint64_t t_finish_us);

/* Drops held results with seq <= ack. */
void cl_ack(cl_table *t, cl_client *c, uint64_t ack);

#endif
