// symbolize.cc — see symbolize.h.
#include "guard/server/symbolize.h"

#include <cxxabi.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "checkpoint/spawn.h"

namespace lockstep {

struct Symbolizer::ElfSymbols {
  struct Func {
    uint64_t start, size;
    std::string name;
  };
  struct Segment {
    uint64_t file_offset, vaddr, size;
  };
  std::vector<Func> funcs;  // sorted by start
  std::vector<Segment> loads;
  bool ok = false;

  // The link-time address of a byte of the file, if a segment loads it.
  bool VaddrOf(uint64_t file_offset, uint64_t* vaddr) const {
    for (const Segment& l : loads)
      if (file_offset >= l.file_offset && file_offset < l.file_offset + l.size) {
        *vaddr = file_offset - l.file_offset + l.vaddr;
        return true;
      }
    return false;
  }

  const Func* At(uint64_t vaddr) const {
    auto it = std::upper_bound(funcs.begin(), funcs.end(), vaddr,
                               [](uint64_t v, const Func& f) { return v < f.start; });
    if (it == funcs.begin()) return nullptr;
    --it;
    // A symbol without a size covers up to the next one.
    uint64_t end = it->size ? it->start + it->size
                            : (std::next(it) != funcs.end() ? std::next(it)->start : UINT64_MAX);
    return vaddr < end ? &*it : nullptr;
  }

  void Read(const char* base, size_t len) {
    if (len < sizeof(Elf64_Ehdr)) return;
    const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_ident[EI_DATA] != ELFDATA2LSB)
      return;
    auto in_file = [&](uint64_t off, uint64_t n) { return off <= len && n <= len - off; };
    if (!in_file(eh->e_phoff, uint64_t{eh->e_phnum} * sizeof(Elf64_Phdr)) ||
        !in_file(eh->e_shoff, uint64_t{eh->e_shnum} * sizeof(Elf64_Shdr)))
      return;
    const auto* ph = reinterpret_cast<const Elf64_Phdr*>(base + eh->e_phoff);
    for (int i = 0; i < eh->e_phnum; i++)
      if (ph[i].p_type == PT_LOAD) loads.push_back({ph[i].p_offset, ph[i].p_vaddr, ph[i].p_filesz});
    const auto* sh = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
    // The full table when the file has one, else the dynamic one.
    for (uint32_t want : {uint32_t{SHT_SYMTAB}, uint32_t{SHT_DYNSYM}}) {
      for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != want || sh[i].sh_link >= eh->e_shnum) continue;
        const Elf64_Shdr& strs = sh[sh[i].sh_link];
        if (!in_file(sh[i].sh_offset, sh[i].sh_size) || !in_file(strs.sh_offset, strs.sh_size))
          continue;
        const auto* sym = reinterpret_cast<const Elf64_Sym*>(base + sh[i].sh_offset);
        size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
        for (size_t k = 0; k < n; k++) {
          if (ELF64_ST_TYPE(sym[k].st_info) != STT_FUNC || sym[k].st_shndx == SHN_UNDEF ||
              sym[k].st_name >= strs.sh_size)
            continue;
          const char* name = base + strs.sh_offset + sym[k].st_name;
          funcs.push_back({sym[k].st_value, sym[k].st_size,
                           std::string(name, strnlen(name, strs.sh_size - sym[k].st_name))});
        }
      }
      if (!funcs.empty()) break;
    }
    std::sort(funcs.begin(), funcs.end(),
              [](const Func& a, const Func& b) { return a.start < b.start; });
    ok = true;
  }
};

namespace {

// A C++ function's name as it was written ("ns::Class::Method(int)").
std::string Demangled(const std::string& name) {
  if (name.rfind("_Z", 0) != 0) return name;
  int status = 0;
  char* d = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : name;
  free(d);
  return out;
}

}  // namespace

Symbolizer::Symbolizer(pid_t pid) {
  // (Not std::ifstream: reading the maps of a server that exits meanwhile
  // fails with ESRCH, and its underflow throws, in the daemon.)
  std::string maps;
  ReadSmallFile("/proc/" + std::to_string(pid) + "/maps", &maps, 64u << 20);
  std::istringstream in(maps);
  std::string line;
  while (std::getline(in, line)) {
    // start-end perms offset dev inode [path]
    unsigned long long start = 0, end = 0, offset = 0;
    char perms[8] = {0};
    int path_at = 0;
    if (sscanf(line.c_str(), "%llx-%llx %7s %llx %*s %*s %n", &start, &end, perms, &offset,
               &path_at) < 4)
      continue;
    if (perms[2] != 'x') continue;  // code only
    std::string path = path_at > 0 ? line.substr(static_cast<size_t>(path_at)) : "";
    maps_.push_back({start, end, offset, path});
  }
  pid_root_ = "/proc/" + std::to_string(pid) + "/root";
}

Symbolizer::~Symbolizer() = default;

Symbolizer::ElfSymbols* Symbolizer::SymbolsOf(const std::string& path) {
  auto it = files_.find(path);
  if (it != files_.end()) return it->second.get();
  auto syms = std::make_unique<ElfSymbols>();
  // The path as the process sees it (its root may not be ours).
  int fd = open((pid_root_ + path).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size > 0) {
    void* m = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) {
      syms->Read(static_cast<const char*>(m), static_cast<size_t>(st.st_size));
      munmap(m, static_cast<size_t>(st.st_size));
    }
  }
  if (fd >= 0) close(fd);
  return files_.emplace(path, std::move(syms)).first->second.get();
}

std::string Symbolizer::Describe(uint64_t pc) {
  char buf[96];
  for (const Mapping& m : maps_) {
    if (pc < m.start || pc >= m.end) continue;
    std::string file = m.path.substr(m.path.rfind('/') + 1);
    uint64_t file_offset = pc - m.start + m.file_offset, vaddr = 0;
    if (m.path.empty() || m.path[0] != '/') {
      snprintf(buf, sizeof buf, "0x%" PRIx64, pc);
      return std::string(buf) + " (" + (m.path.empty() ? "anonymous code" : m.path) + ")";
    }
    ElfSymbols* syms = SymbolsOf(m.path);
    const ElfSymbols::Func* f = nullptr;
    // A return address is just past its call, which may be a function's
    // last instruction: the call itself names the function.
    if (syms->ok && syms->VaddrOf(file_offset, &vaddr)) f = syms->At(vaddr ? vaddr - 1 : 0);
    if (f) {
      snprintf(buf, sizeof buf, "+0x%" PRIx64, vaddr - f->start);
      return Demangled(f->name) + buf + " (" + file + ")";
    }
    snprintf(buf, sizeof buf, "+0x%" PRIx64, file_offset);
    return "?? (" + file + buf + ")";
  }
  snprintf(buf, sizeof buf, "0x%" PRIx64 " (not mapped)", pc);
  return buf;
}

std::string Symbolizer::DescribeStack(const std::vector<uint64_t>& pcs) {
  std::string out;
  for (size_t i = 0; i < pcs.size(); i++)
    out += (i ? "\n" : "") + ("#" + std::to_string(i) + " ") + Describe(pcs[i]);
  return out;
}

}  // namespace lockstep
