// The memory floor of any libvirt agent: a process that only holds a libvirt connection, and
// optionally the domains an agent would have on it (on the test driver they live in this
// process). Prints "ready" once done and keeps the connection until its stdin closes.
//
//   libvirt-floor [--release] URI [DOMAIN_XML_FILE COUNT]
//
// --release: first let go of the clean read-only pages of every file it maps, as an idle
// `toyvm compute` does (core/idle_pages.cpp), so that the two are compared alike.
//
// The file's XML is defined and started COUNT times, each copy with its own uuid: every
// occurrence of the uuid 00000000-0000-4000-8000-000000000000 gets the copy's number in its
// last twelve digits.
#include <libvirt/libvirt.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char placeholder[] = "00000000-0000-4000-8000-000000000000";

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t size = 0, cap = 4096;
  char *text = malloc(cap);
  size_t n;
  while (text && (n = fread(text + size, 1, cap - size - 1, f)) > 0) {
    size += n;
    if (cap - size - 1 == 0) text = realloc(text, cap *= 2);
  }
  fclose(f);
  if (text) text[size] = '\0';
  return text;
}

static int define_domains(virConnectPtr conn, const char *xml_template, long count) {
  const size_t length = sizeof placeholder - 1;
  for (long i = 0; i < count; ++i) {
    char *xml = strdup(xml_template);
    char digits[17];  // a long's hex digits; the copy's number is the last twelve
    snprintf(digits, sizeof digits, "%016lx", (unsigned long)(i + 1));
    for (char *at = xml; (at = strstr(at, placeholder)) != NULL; at += length) memcpy(at + length - 12, digits + 4, 12);
    virDomainPtr domain = virDomainDefineXML(conn, xml);
    free(xml);
    if (!domain) return -1;
    int started = virDomainCreate(domain);
    virDomainFree(domain);
    if (started < 0) return -1;
  }
  return 0;
}

struct mapping {
  unsigned long begin, end;
  int clean_file;  // read-only, backed by a file, no private copy
};

// The read-only file mappings without private copies (relocated pages), from smaps.
static size_t clean_file_mappings(struct mapping *out, size_t cap) {
  FILE *smaps = fopen("/proc/self/smaps", "r");
  if (!smaps) return 0;
  size_t n = 0;
  char line[4096];
  while (fgets(line, sizeof line, smaps)) {
    unsigned long begin, end, kb;
    char perms[8], path[3000] = "";
    if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %2999s", &begin, &end, perms, path) >= 3) {
      if (n == cap) break;
      out[n++] = (struct mapping){begin, end, perms[1] != 'w' && path[0] == '/'};
    } else if (n > 0 && (sscanf(line, "Anonymous: %lu kB", &kb) == 1 || sscanf(line, "Swap: %lu kB", &kb) == 1) &&
               kb > 0) {
      out[n - 1].clean_file = 0;
    }
  }
  fclose(smaps);
  return n;
}

static void release_pages(void) {
  static struct mapping mappings[4096];
  size_t n = clean_file_mappings(mappings, sizeof mappings / sizeof mappings[0]);
  for (size_t i = 0; i < n; ++i)
    if (mappings[i].clean_file) madvise((void *)mappings[i].begin, mappings[i].end - mappings[i].begin, MADV_DONTNEED);
}

int main(int argc, char **argv) {
  int release = argc > 1 && strcmp(argv[1], "--release") == 0;
  argc -= release;
  argv += release;
  if (argc != 2 && argc != 4) {
    fputs("usage: libvirt-floor [--release] URI [DOMAIN_XML_FILE COUNT]\n", stderr);
    return 2;
  }
  virConnectPtr conn = virConnectOpen(argv[1]);
  if (!conn) return 1;
  if (argc == 4) {
    char *xml = read_file(argv[2]);
    if (!xml || define_domains(conn, xml, atol(argv[3])) < 0) return 1;
    free(xml);
  }
  if (release) release_pages();
  puts("ready");
  fflush(stdout);
  char buffer[64];
  while (read(0, buffer, sizeof buffer) > 0) {
  }
  virConnectClose(conn);
  return 0;
}
