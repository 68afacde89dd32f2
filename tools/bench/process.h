#pragma once
// Processes for multi-process tests and `tandem chaos --cluster`: a child running a program
// (optionally inside a network namespace) with its output in a log file, and a network
// namespace joined to this one by a veth pair (another host as far as addresses and sockets
// go) whose link can be cut and restored: a real partition, sockets stay open and nothing
// passes. Linux only; namespaces need root (netns_host::ok() says why not).
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace tandem::bench {

class child_process {
 public:
  // Runs `program` with `args`, stdout and stderr to `log`; inside `netns` if not empty.
  child_process(const std::string& program, std::vector<std::string> args, std::filesystem::path log,
                const std::string& netns = "");
  ~child_process();  // SIGKILLs it if it still runs
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) const;
  // The exit code (128 + signal if killed) once it has ended, -1 while it runs.
  int poll();
  // Waits up to `timeout` for the exit: its code, or -1.
  int wait(std::chrono::milliseconds timeout);
  void kill9();  // and waits for it
  bool running() { return poll() < 0; }
  std::string log() const;
  const std::filesystem::path& log_path() const { return log_; }
  // Waits until the log matches the regex `re`: its first group (or the whole match); empty
  // if the process ended or the timeout passed first.
  std::string wait_for(const std::string& re, std::chrono::milliseconds timeout);
  // From /proc: resident bytes and open descriptors (-1 once it has ended).
  int64_t resident_bytes() const;
  int64_t open_fds() const;

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  int status_ = -1;
};

class netns_host {
 public:
  // Namespace `name` with the veth pair `veth`a (here) / `veth`b (there); `subnet` is the
  // third octet of its /30 in 10.213.0.0/16 (one per host, so several can exist at once).
  netns_host(const std::string& name, const std::string& veth, int subnet);
  // Host `there` of a LAN whose bridge `bridge` (address `here`) takes this end of the pair.
  netns_host(const std::string& name, const std::string& veth, const std::string& bridge, std::string here,
             std::string there);
  ~netns_host();  // deletes both
  netns_host(const netns_host&) = delete;
  netns_host& operator=(const netns_host&) = delete;
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }  // when not ok
  const std::string& name() const { return name_; }
  // A partition: the link goes down (packets stop both ways, connections stay open) ...
  bool cut();
  // ... and comes back.
  bool heal();
  std::string here, there;  // this namespace's address on the link, and the other's

 private:
  bool sh(const std::string& cmd);
  std::string name_, veth_, why_;
  bool ok_ = false;
};

// Runs a shell command; on failure, the first says why (its first line of stderr) in `why`.
bool run_sh(const std::string& cmd, std::string& why);

// A free TCP port on 127.0.0.1 now (another process may take it before it is used).
uint16_t free_port();

}  // namespace tandem::bench

namespace tandem::bench {

// A bridge in this namespace (10.213.<subnet>.1/24) that namespaces join, each by a veth pair
// with its end here in the bridge: a LAN of hosts that reach each other and this one without
// forwarding. Cutting one host's link partitions it from all the others.
class netns_lan {
 public:
  netns_lan(const std::string& bridge, int subnet);
  ~netns_lan();
  netns_lan(const netns_lan&) = delete;
  netns_lan& operator=(const netns_lan&) = delete;
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  const std::string& here() const { return here_; }
  // Host k (0..199) of the LAN: namespace `name`, address 10.213.<subnet>.(10 + k).
  std::unique_ptr<netns_host> add(const std::string& name, const std::string& veth, int k);

 private:
  std::string bridge_, here_, why_;
  int subnet_;
  bool ok_ = false;
};

}  // namespace tandem::bench
