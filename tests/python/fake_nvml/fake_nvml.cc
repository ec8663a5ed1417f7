// A stand-in for the driver's libnvidia-ml.so.1 with the entry points trainsup's preflight
// calls (trainsup/launch/preflight.py), so that its GPU checks run on a machine without a GPU. The
// signatures follow NVML's documented API: nvmlReturn_t is an int enum (0 = success,
// 3 = not supported), nvmlDevice_t an opaque pointer, nvmlEnableState_t an int.
//
// The devices' state comes from the FAKE_NVML environment variable (or FAKE_NVML_FILE, below),
// read at nvmlInit_v2:
//   "count=2 ecc1=3 retired_pending0 remap_pending1 remap_failed0 no_ecc1 init_fails"
// (count of devices; uncorrectable volatile ECC errors of device i; pages pending retirement;
// rows pending remapping; a failed remapping; ECC not supported; nvmlInit_v2 failing).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

extern "C" {

#define MAX_DEVICES 16

struct Device {
  unsigned long long ecc;
  int retired_pending, remap_pending, remap_failed, no_ecc;
};

static Device devices[MAX_DEVICES];
static unsigned count;
static int initialized;

static int flag(const char* spec, const char* name, int index) {
  char word[64];
  snprintf(word, sizeof word, "%s%d", name, index);
  const char* at = strstr(spec, word);
  while (at) {
    char end = at[strlen(word)];
    int starts = at == spec || at[-1] == ' ';
    if (starts && (end == ' ' || end == '\0' || end == '=')) return 1;
    at = strstr(at + 1, word);
  }
  return 0;
}

// FAKE_NVML_FILE, when set, names a file whose first line replaces FAKE_NVML, read at every
// nvmlInit_v2 (a GPU that goes bad while the job runs); "%h" in the name is this host's name,
// so that one setting gives each simulated host a file of its own. No file: FAKE_NVML.
static char file_spec[1024];

static const char* specFromFile(void) {
  const char* pattern = getenv("FAKE_NVML_FILE");
  if (!pattern) return NULL;
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  char path[1024];
  size_t n = 0;
  for (const char* p = pattern; *p && n + 1 < sizeof path; ++p) {
    if (p[0] == '%' && p[1] == 'h') {
      n += (size_t)snprintf(path + n, sizeof path - n, "%s", host);
      if (n >= sizeof path) n = sizeof path - 1;
      ++p;
    } else {
      path[n++] = *p;
    }
  }
  path[n] = '\0';
  FILE* f = fopen(path, "r");
  if (!f) return NULL;
  if (!fgets(file_spec, sizeof file_spec, f)) file_spec[0] = '\0';
  fclose(f);
  return file_spec;
}

int nvmlInit_v2(void) {
  const char* spec = specFromFile();
  if (!spec) spec = getenv("FAKE_NVML");
  if (!spec) spec = "";
  if (strstr(spec, "init_fails")) return 9;  // NVML_ERROR_DRIVER_NOT_LOADED
  memset(devices, 0, sizeof devices);
  const char* c = strstr(spec, "count=");
  count = c ? (unsigned)atoi(c + 6) : 0;
  if (count > MAX_DEVICES) count = MAX_DEVICES;
  for (unsigned i = 0; i < count; ++i) {
    char word[32];
    snprintf(word, sizeof word, "ecc%u=", i);
    const char* e = strstr(spec, word);
    if (e) devices[i].ecc = strtoull(e + strlen(word), NULL, 10);
    devices[i].retired_pending = flag(spec, "retired_pending", (int)i);
    devices[i].remap_pending = flag(spec, "remap_pending", (int)i);
    devices[i].remap_failed = flag(spec, "remap_failed", (int)i);
    devices[i].no_ecc = flag(spec, "no_ecc", (int)i);
  }
  initialized = 1;
  return 0;
}

int nvmlShutdown(void) {
  if (!initialized) return 1;  // NVML_ERROR_UNINITIALIZED
  initialized = 0;
  return 0;
}

int nvmlDeviceGetCount_v2(unsigned* n) {
  if (!initialized) return 1;
  *n = count;
  return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, Device** device) {
  if (!initialized) return 1;
  if (index >= count) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = &devices[index];
  return 0;
}

int nvmlDeviceGetUUID(Device* device, char* uuid, unsigned length) {
  snprintf(uuid, length, "GPU-fake-%02d", (int)(device - devices));
  return 0;
}

// errorType 1 = NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counterType 0 = NVML_VOLATILE_ECC.
int nvmlDeviceGetTotalEccErrors(Device* device, int errorType, int counterType, unsigned long long* eccCounts) {
  if (device->no_ecc) return 3;  // NVML_ERROR_NOT_SUPPORTED
  *eccCounts = (errorType == 1 && counterType == 0) ? device->ecc : 0;
  return 0;
}

int nvmlDeviceGetRetiredPagesPendingStatus(Device* device, int* isPending) {
  *isPending = device->retired_pending;  // NVML_FEATURE_ENABLED = 1
  return 0;
}

int nvmlDeviceGetRemappedRows(Device* device, unsigned* corrRows, unsigned* uncRows, unsigned* isPending,
                              unsigned* failureOccurred) {
  *corrRows = 0;
  *uncRows = device->remap_pending || device->remap_failed;
  *isPending = device->remap_pending;
  *failureOccurred = device->remap_failed;
  return 0;
}

}  // extern "C"
