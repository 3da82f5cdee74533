/* The per-completion work at ingest, in C: the moderation rules' text work (moderation.kernels), the
 * answers verification scores (pool.verification) and the INSERT's arrays (common.db).
 *
 * Each function is the exact twin of a Python or numpy one (tests/platform/test_native.py checks them
 * against each other and against the definitions):
 *
 *   normalise_ascii(texts)  -> list of bytes or None   (normalised_utf8's ASCII texts)
 *   simhashes(datas)        -> bytes, 8 per text        (_simhashes: little-endian int64)
 *   char_counts(texts)      -> bytes, 4 x 8 per text    (_counts: length, non-printable, non-ASCII,
 *                                                        repeated; little-endian int64, text-major)
 *   answers(texts)          -> list of str or None      (sapo_node's extract_answer, per text; used by
 *                                                        pool.verification)
 *   exact_first(exact, ps)  -> list of int             (CopyIndex.exact_matches: each probe digest's
 *                                                        first candidate completion, -1 for none)
 *   near_first(hs, ps, d, k)-> list of int             (CopyIndex.near_matches: the same for simhashes
 *                                                        within d bits, k candidates per band value)
 *   pg_array(kind, oid, xs) -> bytes                    (common.db.binary_array: PostgreSQL's binary
 *                                                        array format, as psycopg's dumpers write it)
 *
 * Every loop is linear in its input; nothing here keeps state between calls or holds the GIL's
 * objects past a call. Inputs are validated (lists of str / bytes): anything else is a TypeError.
 * A list's items are read through strong references taken before anything else runs (`items_of`):
 * an allocation may start the garbage collector, and pg_array reads a uuid's `int`, and either may
 * run Python code that empties or shrinks the list. bench/native_fuzz.py runs every function against
 * its twin under AddressSanitizer and UBSan.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* --- normalise_ascii --------------------------------------------------------------------------- */

/* str.split()'s whitespace among ASCII characters: \t \n \v \f \r, \x1c-\x1f and space. */
static unsigned char is_space[256];
static unsigned char fold[256];

static void
tables_init(void)
{
    for (int c = 0; c < 256; c++) {
        fold[c] = (unsigned char)((c >= 'A' && c <= 'Z') ? c + 32 : c);
        is_space[c] = (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f) || c == ' ';
    }
}

static int
is_str(PyObject *v)
{
    return PyUnicode_Check(v);
}

static int
is_bytes(PyObject *v)
{
    return PyBytes_Check(v);
}

static int
any_object(PyObject *v)
{
    (void)v;
    return 1;
}

/* Strong references to the items of `arg`, a list whose every item passes `check` (a TypeError naming
 * `function` and `items` otherwise), their count in *n; NULL on error. Checked and taken with no
 * Python code in between (PyMem_Malloc starts no garbage collection), so the loops below read items
 * that stay alive and in place whatever runs later. `release_items` gives them back. */
static PyObject **
items_of(PyObject *arg, int (*check)(PyObject *), const char *function, const char *items, Py_ssize_t *n)
{
    if (!PyList_Check(arg))
        goto wrong;
    Py_ssize_t len = PyList_GET_SIZE(arg);
    for (Py_ssize_t i = 0; i < len; i++)
        if (!check(PyList_GET_ITEM(arg, i)))
            goto wrong;
    PyObject **held = PyMem_Malloc(sizeof(PyObject *) * (size_t)(len ? len : 1));
    if (held == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < len; i++)
        held[i] = Py_NewRef(PyList_GET_ITEM(arg, i));
    *n = len;
    return held;
wrong:
    PyErr_Format(PyExc_TypeError, "%s takes a list of %s", function, items);
    return NULL;
}

static void
release_items(PyObject **held, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF(held[i]);
    PyMem_Free(held);
}

/* `" ".join(text.lower().split()).encode()` of each ASCII str; None for any other str. */
static PyObject *
normalise_ascii(PyObject *self, PyObject *arg)
{
    Py_ssize_t n;
    PyObject **texts = items_of(arg, is_str, "normalise_ascii", "str", &n);
    if (texts == NULL)
        return NULL;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *text = texts[i];
        if (!PyUnicode_IS_ASCII(text)) {
            Py_INCREF(Py_None);
            PyList_SET_ITEM(out, i, Py_None);
            continue;
        }
        Py_ssize_t len = PyUnicode_GET_LENGTH(text);
        const unsigned char *src = (const unsigned char *)PyUnicode_DATA(text);
        /* The result is never longer than the text: written in place into a bytes object, then cut. */
        PyObject *result = PyBytes_FromStringAndSize(NULL, len);
        if (result == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(result);
        /* Without branches (a space every few characters made them mispredict: 1.6 ns a byte
         * before, 1.2 now, on ~300-character completions): a space is written where one is owed
         * and kept only when a word follows; a character is written always and kept only when it
         * is not a space. Neither write passes the text's length: `at` never exceeds the
         * characters read, and it is behind by at least one while a space is owed. */
        Py_ssize_t at = 0;
        unsigned int pending_space = 0; /* 1 after a run of spaces that follows a word */
        for (Py_ssize_t k = 0; k < len; k++) {
            unsigned char c = src[k];
            unsigned int space = is_space[c];
            dst[at] = ' ';
            at += pending_space & (space ^ 1u);
            dst[at] = fold[c];
            at += space ^ 1u;
            pending_space = space & (at > 0); /* a space only between words: none leading */
        }
        if (at != len && _PyBytes_Resize(&result, at) < 0) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, result);
    }
done:
    release_items(texts, n);
    return out;
}

/* --- simhashes --------------------------------------------------------------------------------- */

#define SHINGLE 4
#define FNV UINT64_C(1099511628211)
#define MIX1 UINT64_C(0xFF51AFD7ED558CCD)
#define MIX2 UINT64_C(0xC4CEB9FE1A85EC53)
#define LANE_MASK UINT64_C(0x0101010101010101)
/* (((1 * F + 1) * F + 1) * F + 1) mod 2^64: the gram hash (b0+1)F^3 + (b1+1)F^2 + (b2+1)F + (b3+1) is
 * b0F^3 + b1F^2 + b2F + b3 plus this. */
#define GRAM_CONSTANT ((((UINT64_C(1) * FNV + 1) * FNV + 1) * FNV + 1))

static inline uint64_t
gram_hash(const unsigned char *p)
{
    uint64_t h = (((uint64_t)p[0] * FNV + p[1]) * FNV + p[2]) * FNV + p[3] + GRAM_CONSTANT;
    h ^= h >> 33;
    h *= MIX1;
    h ^= h >> 33;
    h *= MIX2;
    h ^= h >> 33;
    return h;
}

/* The 64-bit simhash of one text's byte 4-grams: bit b set when more than half the grams have it.
 * Bits are counted 8 at a time: word j of a gram's hash keeps its bits j, 8+j, ..., 56+j, one in each
 * 8-bit lane, so a lane is emptied into the counts at least every 255 grams. */
/* Built for three instruction sets where GCC and glibc can choose at load time (x86-64 Linux): AVX-512,
 * AVX2, and the baseline. The lane loops vectorise: 2.5 times faster on AVX-512 (docs/benchmarks.md),
 * the same integers. Elsewhere (clang, macOS, ARM, musl) one build for the compiler's target. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
static uint64_t
simhash_of(const unsigned char *data, Py_ssize_t len)
{
    unsigned char padded[SHINGLE] = {0, 0, 0, 0};
    if (len < SHINGLE) {
        memcpy(padded, data, (size_t)len);
        data = padded;
        len = SHINGLE;
    }
    Py_ssize_t windows = len - SHINGLE + 1;
    int64_t ones[64] = {0};
    Py_ssize_t start = 0;
    while (start < windows) {
        Py_ssize_t stop = start + 255 < windows ? start + 255 : windows;
        uint64_t lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (Py_ssize_t w = start; w < stop; w++) {
            uint64_t h = gram_hash(data + w);
            for (int j = 0; j < 8; j++)
                lanes[j] += (h >> j) & LANE_MASK;
        }
        for (int j = 0; j < 8; j++)
            for (int lane = 0; lane < 8; lane++)
                ones[8 * lane + j] += (int64_t)((lanes[j] >> (8 * lane)) & 0xFF);
        start = stop;
    }
    uint64_t value = 0;
    for (int b = 0; b < 64; b++)
        if (2 * ones[b] > windows)
            value |= UINT64_C(1) << b;
    return value;
}

static void
put_le64(unsigned char *at, uint64_t v)
{
    for (int k = 0; k < 8; k++)
        at[k] = (unsigned char)(v >> (8 * k));
}

/* The simhash of each bytes object (cut and encoded by the caller), 8 bytes each, little-endian. */
static PyObject *
simhashes(PyObject *self, PyObject *arg)
{
    Py_ssize_t n;
    PyObject **datas = items_of(arg, is_bytes, "simhashes", "bytes", &n);
    if (datas == NULL)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 8 * n);
    if (out != NULL) {
        unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out);
        for (Py_ssize_t i = 0; i < n; i++)
            put_le64(dst + 8 * i,
                     simhash_of((const unsigned char *)PyBytes_AS_STRING(datas[i]), PyBytes_GET_SIZE(datas[i])));
    }
    release_items(datas, n);
    return out;
}

/* --- char_counts ------------------------------------------------------------------------------- */

/* Non-printable: controls other than tab/newline/carriage return, zero-width and bidi marks, BOM
 * (moderation.kernels.NONPRINTABLE: the same ranges). */
static inline int
nonprintable(Py_UCS4 c)
{
    return c <= 0x08 || c == 0x0B || c == 0x0C || (c >= 0x0E && c <= 0x1F) || (c >= 0x7F && c <= 0x9F) ||
           (c >= 0x200B && c <= 0x200F) || (c >= 0x202A && c <= 0x202E) || (c >= 0x2060 && c <= 0x2064) ||
           c == 0xFEFF;
}

/* Per str: its length in code points, and how many of them are non-printable, non-ASCII, and equal
 * to the one before. */
static PyObject *
char_counts(PyObject *self, PyObject *arg)
{
    Py_ssize_t n;
    PyObject **texts = items_of(arg, is_str, "char_counts", "str", &n);
    if (texts == NULL)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 32 * n);
    if (out == NULL)
        goto done;
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *text = texts[i];
        Py_ssize_t len = PyUnicode_GET_LENGTH(text);
        int kind = PyUnicode_KIND(text);
        const void *data = PyUnicode_DATA(text);
        uint64_t bad = 0, wide = 0, repeated = 0;
        if (kind == PyUnicode_1BYTE_KIND) {
            const Py_UCS1 *s = (const Py_UCS1 *)data;
            for (Py_ssize_t k = 0; k < len; k++) {
                bad += nonprintable(s[k]);
                wide += s[k] > 127;
                repeated += k > 0 && s[k] == s[k - 1];
            }
        }
        else {
            for (Py_ssize_t k = 0; k < len; k++) {
                Py_UCS4 c = PyUnicode_READ(kind, data, k);
                bad += nonprintable(c);
                wide += c > 127;
                repeated += k > 0 && c == PyUnicode_READ(kind, data, k - 1);
            }
        }
        put_le64(dst + 32 * i, (uint64_t)len);
        put_le64(dst + 32 * i + 8, bad);
        put_le64(dst + 32 * i + 16, wide);
        put_le64(dst + 32 * i + 24, repeated);
    }
done:
    release_items(texts, n);
    return out;
}

/* --- answers ---------------------------------------------------------------------------------- */

static PyObject *answer_open, *answer_close; /* "<answer>", "</answer>" */

/* sapo_node.verifiers.answers.extract_answer of each str, the same algorithm: matches left to right,
 * each from an opening tag to the first closing tag after it, the search going on after that closing
 * tag; the last match's text, stripped of what str.isspace calls whitespace; None without one. Each
 * text is searched by CPython's own str.find (PyUnicode_Find), so the cost stays linear. */
static PyObject *
answers(PyObject *self, PyObject *arg)
{
    Py_ssize_t n;
    PyObject **texts = items_of(arg, is_str, "answers", "str", &n);
    if (texts == NULL)
        return NULL;
    const Py_ssize_t open_len = 8, close_len = 9;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *text = texts[i];
        Py_ssize_t len = PyUnicode_GET_LENGTH(text), pos = 0, start = -1, end = -1;
        for (;;) {
            Py_ssize_t o = PyUnicode_Find(text, answer_open, pos, len, 1);
            if (o == -2)
                goto fail;
            if (o < 0)
                break;
            Py_ssize_t c = PyUnicode_Find(text, answer_close, o + open_len, len, 1);
            if (c == -2)
                goto fail;
            if (c < 0)
                break;
            start = o + open_len;
            end = c;
            pos = c + close_len;
        }
        PyObject *result;
        if (start < 0) {
            result = Py_NewRef(Py_None);
        }
        else {
            int kind = PyUnicode_KIND(text);
            const void *data = PyUnicode_DATA(text);
            while (start < end && Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, start)))
                start++;
            while (end > start && Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, end - 1)))
                end--;
            result = PyUnicode_Substring(text, start, end);
            if (result == NULL)
                goto fail;
        }
        PyList_SET_ITEM(out, i, result);
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    release_items(texts, n);
    return out;
}

/* --- pg_array ---------------------------------------------------------------------------------- */

/* Element kinds (sapo_native.ARRAY_KINDS names them). */
enum { K_TEXT = 0, K_BYTEA = 1, K_INT4 = 2, K_INT8 = 3, K_BOOL = 4, K_UUID = 5, K_KINDS = 6 };

static void
put_be32(unsigned char *at, uint32_t v)
{
    at[0] = (unsigned char)(v >> 24);
    at[1] = (unsigned char)(v >> 16);
    at[2] = (unsigned char)(v >> 8);
    at[3] = (unsigned char)v;
}

static void
put_be64(unsigned char *at, uint64_t v)
{
    put_be32(at, (uint32_t)(v >> 32));
    put_be32(at + 4, (uint32_t)v);
}

static int
element_error(Py_ssize_t i, const char *expected)
{
    PyErr_Format(PyExc_TypeError, "pg_array: element %zd is not %s", i, expected);
    return -2;
}

/* The bytes of element i (a text's UTF-8, a bytea's bytes) or its fixed width, -1 for None; -2 on
 * error. `*data` is set for text and bytea. */
static Py_ssize_t
element_size(int kind, PyObject *v, Py_ssize_t i, const char **data)
{
    if (v == Py_None)
        return -1;
    switch (kind) {
    case K_TEXT: {
        if (!PyUnicode_Check(v))
            return element_error(i, "a str");
        Py_ssize_t len;
        *data = PyUnicode_AsUTF8AndSize(v, &len); /* the str's own bytes when ASCII; a lone surrogate raises */
        return *data == NULL ? -2 : len;
    }
    case K_BYTEA:
        if (!PyBytes_Check(v))
            return element_error(i, "bytes");
        *data = PyBytes_AS_STRING(v);
        return PyBytes_GET_SIZE(v);
    case K_INT4:
    case K_INT8:
        if (!PyLong_Check(v) || PyBool_Check(v))
            return element_error(i, "an int");
        return kind == K_INT4 ? 4 : 8;
    case K_BOOL:
        if (!PyBool_Check(v))
            return element_error(i, "a bool");
        return 1;
    default: /* K_UUID */
        return 16;
    }
}

static int
write_element(int kind, PyObject *v, Py_ssize_t i, const char *data, Py_ssize_t size, unsigned char *at)
{
    switch (kind) {
    case K_TEXT:
    case K_BYTEA:
        memcpy(at, data, (size_t)size);
        return 0;
    case K_INT4: {
        long long x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (x < INT32_MIN || x > INT32_MAX) {
            PyErr_Format(PyExc_OverflowError, "pg_array: element %zd does not fit int4", i);
            return -1;
        }
        put_be32(at, (uint32_t)(int32_t)x);
        return 0;
    }
    case K_INT8: {
        long long x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred())
            return -1;
        put_be64(at, (uint64_t)x);
        return 0;
    }
    case K_BOOL:
        *at = v == Py_True;
        return 0;
    default: { /* K_UUID: a uuid.UUID, read through its `int` (128 bits, unsigned) */
        PyObject *number = PyObject_GetAttrString(v, "int");
        if (number == NULL || !PyLong_Check(number)) {
            Py_XDECREF(number);
            PyErr_Clear();
            return element_error(i, "a uuid.UUID");
        }
        PyObject *shift = PyLong_FromLong(64);
        PyObject *high = shift ? PyNumber_Rshift(number, shift) : NULL;
        Py_XDECREF(shift);
        if (high == NULL) {
            Py_DECREF(number);
            return -1;
        }
        unsigned long long lo = PyLong_AsUnsignedLongLongMask(number);
        unsigned long long hi = PyLong_AsUnsignedLongLong(high); /* raises past 128 bits */
        Py_DECREF(number);
        Py_DECREF(high);
        if (PyErr_Occurred())
            return -1;
        put_be64(at, hi);
        put_be64(at + 8, lo);
        return 0;
    }
    }
}

/* A one-dimensional PostgreSQL array in its binary wire format (what array_send writes): the
 * header (dimensions, a has-nulls flag, the element type's oid, the length and lower bound 1), then
 * each element as its length (-1 for NULL) and its binary value. */
static PyObject *
pg_array(PyObject *self, PyObject *args)
{
    int kind;
    unsigned int element_oid;
    PyObject *values;
    if (!PyArg_ParseTuple(args, "iIO!:pg_array", &kind, &element_oid, &PyList_Type, &values))
        return NULL;
    if (kind < 0 || kind >= K_KINDS) {
        PyErr_Format(PyExc_ValueError, "pg_array: unknown element kind %d", kind);
        return NULL;
    }
    Py_ssize_t n;
    PyObject **items = items_of(values, any_object, "pg_array", "values", &n);
    if (items == NULL)
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t total = n ? 20 : 12;
    int nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *data = NULL;
        Py_ssize_t size = element_size(kind, items[i], i, &data);
        if (size == -2)
            goto done;
        if (size > INT32_MAX) {
            PyErr_Format(PyExc_OverflowError, "pg_array: element %zd is over 2 GB", i);
            goto done;
        }
        nulls |= size == -1;
        total += 4 + (size > 0 ? size : 0);
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        goto done;
    unsigned char *at = (unsigned char *)PyBytes_AS_STRING(out);
    unsigned char *end = at + total;
    put_be32(at, n ? 1 : 0);
    put_be32(at + 4, (uint32_t)nulls);
    put_be32(at + 8, element_oid);
    at += 12;
    if (n) {
        put_be32(at, (uint32_t)n);
        put_be32(at + 4, 1);
        at += 8;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = items[i];
        const char *data = NULL;
        /* The items are held (the list may change under a uuid's `int`, not what is read here) and
         * immutable, so their sizes are those of the first pass; taken again for `data`, and checked
         * against the buffer all the same. */
        Py_ssize_t size = element_size(kind, v, i, &data);
        if (size == -2)
            goto fail;
        if (end - at < 4 + (size > 0 ? size : 0))
            goto changed;
        put_be32(at, (uint32_t)(int32_t)size);
        at += 4;
        if (size < 0)
            continue;
        if (write_element(kind, v, i, data, size, at) < 0)
            goto fail;
        at += size;
    }
    if (at == end)
        goto done;
changed:
    PyErr_SetString(PyExc_RuntimeError, "pg_array: an element changed while it was encoded");
fail:
    Py_CLEAR(out);
done:
    release_items(items, n);
    return out;
}

/* --- exact_first, near_first: the copy rules' lookups (filters.CopyIndex) ----------------------- */

/* A small open-addressing table of distinct keys (at most `cap` / 2 of them, `cap` a power of two),
 * each with an int32 value; the keys' slots are found by a multiplicative hash. Allocated per call;
 * table_free releases it, whether table_init succeeded or not (start from `Table t = {0}`). */
typedef struct {
    uint64_t *keys;
    int32_t *values;
    unsigned char *used;
    size_t mask;
} Table;

static int
table_init(Table *t, size_t distinct)
{
    size_t cap = 16;
    while (cap < 2 * distinct)
        cap <<= 1;
    t->mask = cap - 1;
    t->keys = PyMem_Calloc(cap, sizeof(uint64_t));
    t->values = PyMem_Calloc(cap, sizeof(int32_t));
    t->used = PyMem_Calloc(cap, 1);
    if (t->keys == NULL || t->values == NULL || t->used == NULL) {
        PyErr_NoMemory(); /* what was allocated is the caller's table_free's */
        return -1;
    }
    return 0;
}

static void
table_free(Table *t)
{
    PyMem_Free(t->keys);
    PyMem_Free(t->values);
    PyMem_Free(t->used);
}

static inline size_t
table_slot(const Table *t, uint64_t key)
{
    size_t i = (size_t)((key * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & t->mask;
    while (t->used[i] && t->keys[i] != key)
        i = (i + 1) & t->mask;
    return i;
}

static inline uint64_t
get_be64(const unsigned char *at)
{
    uint64_t v = 0;
    for (int k = 0; k < 8; k++)
        v = (v << 8) | at[k];
    return v;
}

static inline uint64_t
get_le64(const unsigned char *at)
{
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--)
        v = (v << 8) | at[k];
    return v;
}

/* A list of `n` ints: values[i], -1 where none. */
static PyObject *
int_list(const int32_t *values, Py_ssize_t n)
{
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLong(values[i]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

#define DIGEST 16

/* Drawn once per process (PyInit__text): the key of `digest_key`. */
static uint64_t digest_seed[2];

static inline uint64_t
mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= MIX1;
    h ^= h >> 33;
    h *= MIX2;
    h ^= h >> 33;
    return h;
}

/* A 64-bit key of a whole 16-byte digest, through a secret drawn per process: digests that share
 * their first 8 bytes (or any other part) share a key only by chance, whoever chose them, so the
 * chains below stay a digest or two long. (Keyed by the first 8 bytes alone, 16,000 digests sharing
 * them made every lookup walk all of them: 0.95 s.) */
static inline uint64_t
digest_key(const unsigned char *digest)
{
    return mix64(mix64(get_le64(digest) ^ digest_seed[0]) ^ get_le64(digest + 8) ^ digest_seed[1]);
}

/* Per 16-byte probe digest (`probes`, concatenated), the index of the first candidate completion
 * (`exact`: their 16-byte digests concatenated, in the order added) with that digest, or -1. The
 * probes' distinct digests are chained per key (`digest_key`) in a table; one pass over the
 * candidates, a lookup each (and a whole-digest comparison per distinct digest of that key), stopping
 * once every distinct digest is found: O(candidates + probes). */
static PyObject *
exact_first(PyObject *self, PyObject *args)
{
    Py_buffer exact, probes;
    if (!PyArg_ParseTuple(args, "y*y*:exact_first", &exact, &probes))
        return NULL;
    PyObject *out = NULL;
    int32_t *first = NULL, *rep = NULL, *next = NULL, *of = NULL;
    Table t = {0};
    if (exact.len % DIGEST || probes.len % DIGEST || exact.len / DIGEST > INT32_MAX ||
        probes.len / DIGEST > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "exact_first: buffers of 16-byte digests expected");
        goto done;
    }
    Py_ssize_t n = exact.len / DIGEST, p = probes.len / DIGEST;
    size_t room = sizeof(int32_t) * (size_t)(p ? p : 1);
    first = PyMem_Malloc(room); /* per distinct digest: its first candidate, or -1 */
    rep = PyMem_Malloc(room);   /* per distinct digest: a probe holding it */
    next = PyMem_Malloc(room);  /* per distinct digest: the next one sharing its first 8 bytes, or -1 */
    of = PyMem_Malloc(room);    /* per probe: its distinct digest */
    if (first == NULL || rep == NULL || next == NULL || of == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (table_init(&t, (size_t)p) < 0)
        goto done;
    const unsigned char *pd = probes.buf, *cd = exact.buf;
    Py_ssize_t distinct = 0;
    for (Py_ssize_t i = 0; i < p; i++) {
        const unsigned char *digest = pd + DIGEST * i;
        uint64_t key = digest_key(digest);
        size_t s = table_slot(&t, key);
        if (!t.used[s]) {
            t.used[s] = 1;
            t.keys[s] = key;
            t.values[s] = -1;
        }
        int32_t u = t.values[s];
        while (u >= 0 && memcmp(pd + DIGEST * rep[u], digest, DIGEST) != 0)
            u = next[u];
        if (u < 0) {
            u = (int32_t)distinct++;
            rep[u] = (int32_t)i;
            first[u] = -1;
            next[u] = t.values[s];
            t.values[s] = u;
        }
        of[i] = u;
    }
    Py_ssize_t missing = distinct;
    for (Py_ssize_t c = 0; c < n && missing > 0; c++) {
        const unsigned char *digest = cd + DIGEST * c;
        size_t s = table_slot(&t, digest_key(digest));
        if (!t.used[s])
            continue;
        for (int32_t u = t.values[s]; u >= 0; u = next[u])
            if (first[u] < 0 && memcmp(pd + DIGEST * rep[u], digest, DIGEST) == 0) {
                first[u] = (int32_t)c;
                missing--;
            }
    }
    for (Py_ssize_t i = 0; i < p; i++)
        of[i] = first[of[i]];
    out = int_list(of, p);
done:
    table_free(&t);
    PyMem_Free(first);
    PyMem_Free(rep);
    PyMem_Free(next);
    PyMem_Free(of);
    PyBuffer_Release(&exact);
    PyBuffer_Release(&probes);
    return out;
}

/* Per probe simhash (`probes`, a list of int64), the first candidate (`hashes`: 8-byte big-endian
 * simhashes concatenated, in the order added) within `max_distance` bits, or -1: for each of the probe's
 * `BANDS` 16-bit bands in order, among the first `bucket` candidates (in the order added) with the same
 * value in that band, the first within the distance (filters.CopyIndex.near_matches: the same pairs in
 * the same order). The probes' band values are marked in a bitmap and chained in a table; one pass over
 * the candidates fills the buckets: O(candidates x BANDS + probes x BANDS x bucket). */
#define BANDS 4 /* moderation.kernels.BANDS, 16 bits each: the lookup tests hold the two to one definition */

/* The first of `size` candidates (indices `members` into the big-endian hashes `hd`) within
 * `max_distance` bits of `probe`, or -1. Cloned as simhash_of is: the baseline x86-64 has no popcount
 * instruction (GCC calls a library routine), x86-64-v2 and later do. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
static int32_t
first_within(uint64_t probe, const unsigned char *hd, const int32_t *members, int32_t size, int max_distance)
{
    for (int32_t j = 0; j < size; j++)
        if (__builtin_popcountll(probe ^ get_be64(hd + 8 * (size_t)members[j])) <= max_distance)
            return members[j];
    return -1;
}

static PyObject *
near_first(PyObject *self, PyObject *args)
{
    Py_buffer hashes;
    PyObject *probe_list;
    int max_distance, bucket;
    if (!PyArg_ParseTuple(args, "y*O!ii:near_first", &hashes, &PyList_Type, &probe_list, &max_distance, &bucket))
        return NULL;
    PyObject *out = NULL;
    uint64_t *probes = NULL;
    int32_t *found = NULL, *members = NULL, *sizes = NULL;
    unsigned char *marked = NULL;
    Table t = {0};
    Py_ssize_t p = PyList_GET_SIZE(probe_list);
    if (hashes.len % 8 || hashes.len / 8 > INT32_MAX || bucket < 0 || p > INT32_MAX / BANDS) {
        PyErr_SetString(PyExc_ValueError, "near_first: a buffer of 8-byte simhashes and a bucket >= 0 expected");
        goto done;
    }
    Py_ssize_t n = hashes.len / 8;
    probes = PyMem_Malloc(sizeof(uint64_t) * (size_t)(p ? p : 1));
    found = PyMem_Malloc(sizeof(int32_t) * (size_t)(p ? p : 1));
    if (probes == NULL || found == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < p; i++) {
        PyObject *v = PyList_GET_ITEM(probe_list, i);
        if (!PyLong_Check(v)) {
            PyErr_SetString(PyExc_TypeError, "near_first takes a list of int");
            goto done;
        }
        long long x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred())
            goto done;
        probes[i] = (uint64_t)x;
        found[i] = -1;
    }
    if (p == 0 || n == 0 || bucket == 0) {
        out = int_list(found, p);
        goto done;
    }
    /* Distinct tagged band values (band << 16 | value) of the probes, each with a bucket of candidates. */
    if (table_init(&t, (size_t)(BANDS * p)) < 0)
        goto done;
    marked = PyMem_Calloc((size_t)BANDS << 13, 1); /* a bit per tagged band value */
    members = PyMem_Malloc(sizeof(int32_t) * (size_t)BANDS * (size_t)p * (size_t)bucket);
    sizes = PyMem_Calloc((size_t)BANDS * (size_t)p, sizeof(int32_t));
    if (marked == NULL || members == NULL || sizes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int32_t keys = 0;
    for (Py_ssize_t i = 0; i < p; i++)
        for (int b = 0; b < BANDS; b++) {
            uint32_t tag = ((uint32_t)b << 16) | (uint32_t)((probes[i] >> (16 * b)) & 0xFFFF);
            size_t s = table_slot(&t, tag);
            if (!t.used[s]) {
                t.used[s] = 1;
                t.keys[s] = tag;
                t.values[s] = keys++;
                marked[tag >> 3] |= (unsigned char)(1u << (tag & 7));
            }
        }
    const unsigned char *hd = hashes.buf;
    for (Py_ssize_t c = 0; c < n; c++) {
        uint64_t h = get_be64(hd + 8 * c);
        for (int b = 0; b < BANDS; b++) {
            uint32_t tag = ((uint32_t)b << 16) | (uint32_t)((h >> (16 * b)) & 0xFFFF);
            if (!(marked[tag >> 3] & (1u << (tag & 7))))
                continue;
            int32_t k = t.values[table_slot(&t, tag)];
            if (sizes[k] < bucket)
                members[(size_t)k * (size_t)bucket + (size_t)sizes[k]++] = (int32_t)c;
        }
    }
    for (Py_ssize_t i = 0; i < p; i++)
        for (int b = 0; b < BANDS && found[i] < 0; b++) {
            uint32_t tag = ((uint32_t)b << 16) | (uint32_t)((probes[i] >> (16 * b)) & 0xFFFF);
            int32_t k = t.values[table_slot(&t, tag)];
            found[i] = first_within(probes[i], hd, members + (size_t)k * (size_t)bucket, sizes[k], max_distance);
        }
    out = int_list(found, p);
done:
    table_free(&t);
    PyMem_Free(probes);
    PyMem_Free(found);
    PyMem_Free(members);
    PyMem_Free(sizes);
    PyMem_Free(marked);
    PyBuffer_Release(&hashes);
    return out;
}

static PyMethodDef methods[] = {
    {"normalise_ascii", normalise_ascii, METH_O,
     "normalise_ascii(texts: list[str]) -> list[bytes | None]\n\n"
     "' '.join(t.lower().split()).encode() of each ASCII text; None for the others."},
    {"simhashes", simhashes, METH_O,
     "simhashes(datas: list[bytes]) -> bytes\n\n"
     "The 64-bit simhash of each text's byte 4-grams (zero-padded to 4 bytes), little-endian, 8 bytes each."},
    {"char_counts", char_counts, METH_O,
     "char_counts(texts: list[str]) -> bytes\n\n"
     "Per text, 4 little-endian int64: length, non-printable, non-ASCII and repeated characters."},
    {"answers", answers, METH_O,
     "answers(texts: list[str]) -> list[str | None]\n\n"
     "sapo_node.verifiers.answers.extract_answer of each text: the last <answer>...</answer>'s text, stripped."},
    {"pg_array", pg_array, METH_VARARGS,
     "pg_array(kind: int, element_oid: int, values: list) -> bytes\n\n"
     "values as a one-dimensional PostgreSQL array in binary wire format; kind: 0 text, 1 bytea, 2 int4,\n"
     "3 int8, 4 bool, 5 uuid (uuid.UUID). None is NULL."},
    {"exact_first", exact_first, METH_VARARGS,
     "exact_first(exact: bytes, probes: bytes) -> list[int]\n\n"
     "Per 16-byte probe digest, the index of the first 16-byte candidate digest equal to it, or -1."},
    {"near_first", near_first, METH_VARARGS,
     "near_first(hashes: bytes, probes: list[int], max_distance: int, bucket: int) -> list[int]\n\n"
     "Per probe simhash, the first candidate (8-byte big-endian) within max_distance bits among the first\n"
     "`bucket` candidates sharing each of its 4 16-bit bands, bands in order, or -1."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_text", .m_doc = NULL, .m_size = -1, .m_methods = methods,
};

/* digest_seed from os.urandom. */
static int
seed_init(void)
{
    PyObject *os = PyImport_ImportModule("os");
    PyObject *random = os ? PyObject_CallMethod(os, "urandom", "i", (int)sizeof(digest_seed)) : NULL;
    Py_XDECREF(os);
    if (random == NULL)
        return -1;
    if (!PyBytes_Check(random) || PyBytes_GET_SIZE(random) != (Py_ssize_t)sizeof(digest_seed)) {
        Py_DECREF(random);
        PyErr_SetString(PyExc_RuntimeError, "os.urandom gave no seed");
        return -1;
    }
    memcpy(digest_seed, PyBytes_AS_STRING(random), sizeof(digest_seed));
    Py_DECREF(random);
    return 0;
}

PyMODINIT_FUNC
PyInit__text(void)
{
    tables_init();
    if (seed_init() < 0)
        return NULL;
    answer_open = PyUnicode_InternFromString("<answer>");
    answer_close = PyUnicode_InternFromString("</answer>");
    if (answer_open == NULL || answer_close == NULL)
        return NULL;
    return PyModule_Create(&module);
}
