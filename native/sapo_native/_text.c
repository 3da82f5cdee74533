/* The per-completion work at ingest, in C: the moderation rules' text work (moderation.filters), the
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
 *   pg_array(kind, oid, xs) -> bytes                    (common.db.binary_array: PostgreSQL's binary
 *                                                        array format, as psycopg's dumpers write it)
 *
 * Every loop is linear in its input; nothing here keeps state between calls or holds the GIL's
 * objects past a call. Inputs are validated (lists of str / bytes): anything else is a TypeError.
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

/* Whether `arg` is a list whose every item passes `check`; a TypeError naming `function` and
 * `items` otherwise. The loops below then have no error path of their own. */
static int
list_of(PyObject *arg, int (*check)(PyObject *), const char *function, const char *items)
{
    if (PyList_Check(arg)) {
        Py_ssize_t n = PyList_GET_SIZE(arg), i = 0;
        while (i < n && check(PyList_GET_ITEM(arg, i)))
            i++;
        if (i == n)
            return 1;
    }
    PyErr_Format(PyExc_TypeError, "%s takes a list of %s", function, items);
    return 0;
}

/* `" ".join(text.lower().split()).encode()` of each ASCII str; None for any other str. */
static PyObject *
normalise_ascii(PyObject *self, PyObject *arg)
{
    if (!list_of(arg, is_str, "normalise_ascii", "str"))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(arg);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *text = PyList_GET_ITEM(arg, i);
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
            Py_DECREF(out);
            return NULL;
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
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, result);
    }
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
    if (!list_of(arg, is_bytes, "simhashes", "bytes"))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(arg);
    PyObject *out = PyBytes_FromStringAndSize(NULL, 8 * n);
    if (out == NULL)
        return NULL;
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *data = PyList_GET_ITEM(arg, i);
        put_le64(dst + 8 * i,
                 simhash_of((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data)));
    }
    return out;
}

/* --- char_counts ------------------------------------------------------------------------------- */

/* Non-printable: controls other than tab/newline/carriage return, zero-width and bidi marks, BOM
 * (filters._NONPRINTABLE: the same ranges). */
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
    if (!list_of(arg, is_str, "char_counts", "str"))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(arg);
    PyObject *out = PyBytes_FromStringAndSize(NULL, 32 * n);
    if (out == NULL)
        return NULL;
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *text = PyList_GET_ITEM(arg, i);
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
    if (!list_of(arg, is_str, "answers", "str"))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(arg);
    const Py_ssize_t open_len = 8, close_len = 9;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *text = PyList_GET_ITEM(arg, i);
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
    return out;
fail:
    Py_DECREF(out);
    return NULL;
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
    Py_ssize_t n = PyList_GET_SIZE(values);
    Py_ssize_t total = n ? 20 : 12;
    int nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *data = NULL;
        Py_ssize_t size = element_size(kind, PyList_GET_ITEM(values, i), i, &data);
        if (size == -2)
            return NULL;
        if (size > INT32_MAX) {
            PyErr_Format(PyExc_OverflowError, "pg_array: element %zd is over 2 GB", i);
            return NULL;
        }
        nulls |= size == -1;
        total += 4 + (size > 0 ? size : 0);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
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
        PyObject *v = PyList_GET_ITEM(values, i);
        const char *data = NULL;
        /* Sizes are taken again rather than kept, and checked against the buffer: a UUID subclass's
         * `int` could run Python code that changes the list between the passes. */
        Py_ssize_t size = element_size(kind, v, i, &data);
        if (size == -2) {
            Py_DECREF(out);
            return NULL;
        }
        if (end - at < 4 + (size > 0 ? size : 0)) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_RuntimeError, "pg_array: the list changed while it was encoded");
            return NULL;
        }
        put_be32(at, (uint32_t)(int32_t)size);
        at += 4;
        if (size < 0)
            continue;
        if (write_element(kind, v, i, data, size, at) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        at += size;
    }
    if (at != end) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_RuntimeError, "pg_array: the list changed while it was encoded");
        return NULL;
    }
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
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_text", .m_doc = NULL, .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__text(void)
{
    tables_init();
    answer_open = PyUnicode_InternFromString("<answer>");
    answer_close = PyUnicode_InternFromString("</answer>");
    if (answer_open == NULL || answer_close == NULL)
        return NULL;
    return PyModule_Create(&module);
}
