#pragma once
// The local cache of files from the hub: {cache}/hub/{owner}--{name}/{file}, each beside a record
// {file}.json (repo, file, sha256, size, commit) written only once the file is verified. A file
// without its record (a download that died, a .part, a .bad) is never used.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem::hub {

struct cached_file {
  std::string repo;  // owner/name
  std::string file;  // the file's name in the repository (may contain '/')
  std::string sha256;  // lowercase hex
  uint64_t size = 0;
  std::string commit;  // the repository's revision it came from
  std::string path;  // where it is on this machine
};

// {root}/{owner}--{name}
std::string repo_dir(const std::string& root, const std::string& repo);
// Where `file` of `repo` lives in the cache (whether there or not).
std::string cache_path(const std::string& root, const std::string& repo, const std::string& file);

// The record beside a verified file, when there is one and the file still has its size.
std::optional<cached_file> read_record(const std::string& file_path);
// Writes the record (atomically: a temporary file renamed into place).
void write_record(const cached_file& f);

// Every verified file, of one repository or (repo empty) all, sorted by repository and file.
std::vector<cached_file> list_cached(const std::string& root, const std::string& repo = "");

// Removes a cached file with its record and any partial or rejected download beside it.
void remove_cached(const cached_file& f);

}  // namespace tandem::hub
