/* mmaplock-prof study's `dispose` addon: Buffers whose memory the code gives back explicitly.
 * alloc(size) returns an external ArrayBuffer over a block of this addon's; free(ab)
 * detaches it (JavaScript can no longer touch it) and keeps the block for the next alloc of
 * the same size. Built by the study with the system compiler against node's headers. */
#define NAPI_VERSION 8
#include <node_api.h>
#include <stdlib.h>

#define KEEP 64

struct block { size_t size; void *p; };
/* Per thread: a Worker's blocks are its own (no lock). */
static __thread struct block kept[KEEP];
static __thread int nkept;

static napi_value Alloc(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], ab;
  int64_t n = 0;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  napi_get_value_int64(env, argv[0], &n);
  void *p = NULL;
  for (int i = nkept - 1; i >= 0; i--) {
    if (kept[i].size == (size_t)n) {
      p = kept[i].p;
      kept[i] = kept[--nkept];
      break;
    }
  }
  if (!p) p = malloc((size_t)n);
  /* No finalizer: the block is the addon's until free (never freed by the GC). */
  napi_create_external_arraybuffer(env, p, (size_t)n, NULL, NULL, &ab);
  return ab;
}

static napi_value Free(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  void *p = NULL;
  size_t n = 0;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  napi_get_arraybuffer_info(env, argv[0], &p, &n);
  napi_detach_arraybuffer(env, argv[0]);
  if (nkept < KEEP) {
    kept[nkept].size = n;
    kept[nkept].p = p;
    nkept++;
  } else {
    free(p);
  }
  return NULL;
}

static napi_value Init(napi_env env, napi_value exports) {
  napi_property_descriptor methods[] = {
    {"alloc", NULL, Alloc, NULL, NULL, NULL, napi_enumerable, NULL},
    {"free", NULL, Free, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  napi_define_properties(env, exports, sizeof methods / sizeof methods[0], methods);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)
