/* proto_int.h - the message table (proto/messages.def) as data, for code
 * that walks a message's fields instead of naming them: the codec in
 * proto.c and tools/rollout-protodump.c. Not part of the stable API in
 * proto.h: the layout of these descriptors may change with the table. */
#ifndef RD_PROTO_INT_H
#define RD_PROTO_INT_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

/* Field kinds; messages.def says what each means on the wire. */
typedef enum {
    PROTO_FK_END = 0,           /* ends a field list */
    PROTO_FK_U8, PROTO_FK_U16, PROTO_FK_U32, PROTO_FK_I32, PROTO_FK_U64, PROTO_FK_F32,
    PROTO_FK_BITS8, PROTO_FK_BITS16, PROTO_FK_BITS32,
    PROTO_FK_ENUM8, PROTO_FK_RANGE32, PROTO_FK_DIMS8,
    PROTO_FK_RSV16, PROTO_FK_RSV24, PROTO_FK_RSV32,
    PROTO_FK_STR, PROTO_FK_BYTES32, PROTO_FK_COUNT,
} proto_field_kind;

typedef struct {
    uint8_t kind;               /* proto_field_kind */
    uint16_t offset;            /* of the struct member (0 for reserved fields) */
    const char *name;           /* wire and struct name */
    uint64_t a, b;              /* allowed bits; or min, max (ENUM8, RANGE32, DIMS8, STR); or COUNT's min bytes per element */
    const char *text;           /* ENUM8, RANGE32, DIMS8: the values expected, for the error message */
} proto_field;

/* The array elements (PROTO_ELEM rows), for dispatch to their tails. */
typedef enum {
#define PROTO_ELEM(NAME, STRUCT, TAIL_MIN) PROTO_EL_##NAME,
#include "proto/messages.def"
#undef PROTO_ELEM
} proto_elem_id;

/* An array element (PROTO_ELEM): its fields, then a hand-written tail. */
typedef struct {
    uint8_t id;                 /* proto_elem_id */
    const char *name;           /* "REQUEST" */
    const proto_field *fields;
    size_t size;                /* sizeof the element struct */
    uint32_t min_bytes;         /* wire bytes at least: fixed fields + tail minimum */
} proto_elem_desc;

typedef struct {
    uint16_t type;
    const char *name;           /* "HELLO" */
    int is_request;
    const proto_field *fields;  /* the body, up to the elements */
    const proto_elem_desc *elem; /* NULL: none */
    int raw_bytes;              /* UPDATE_CHUNK: the COUNT is of data bytes pointing into the frame */
    uint16_t array_offset;      /* of the element pointer in the struct */
    const char *array_name;     /* "requests" */
} proto_msg_desc;

/* The row for a type, or NULL when this version does not define it. */
const proto_msg_desc *proto_msg_find(uint16_t type);
/* The struct of a message inside proto_msg (every union member starts there). */
#define PROTO_MSG_BODY(m) ((void *)&(m)->hello)

/* Writes the list of defined types, grouped in runs of consecutive codes:
 * "HELLO..AUTH (0x01..0x08), ..., ERROR (0xff)" (the UNKNOWN_TYPE text). */
void proto_types_expected(char *out, size_t cap);

#endif
