#include "tools/bench/process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

namespace tandem::bench {

child_process::child_process(const std::string& program, std::vector<std::string> args, std::filesystem::path log,
                             const std::string& netns)
    : log_(std::move(log)) {
  std::string exe = program;
  if (!netns.empty()) {
    args.insert(args.begin(), {"netns", "exec", netns, program});
    exe = "/usr/sbin/ip";
  }
  std::vector<char*> argv;
  argv.push_back(exe.data());
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::filesystem::remove(log_);
  pid_ = ::fork();
  if (pid_ == 0) {
    const int fd = ::open(log_.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(exe.c_str(), argv.data());
    _exit(127);
  }
}

child_process::~child_process() {
  if (pid_ > 0 && status_ < 0) {
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

void child_process::signal(int sig) const {
  if (pid_ > 0 && status_ < 0) ::kill(pid_, sig);
}

int child_process::poll() {
  if (status_ >= 0 || pid_ <= 0) return status_;
  int st = 0;
  if (::waitpid(pid_, &st, WNOHANG) == pid_) status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return status_;
}

int child_process::wait(std::chrono::milliseconds timeout) {
  for (auto until = std::chrono::steady_clock::now() + timeout; std::chrono::steady_clock::now() < until;) {
    if (poll() >= 0) return status_;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return poll();
}

void child_process::kill9() {
  signal(SIGCONT);
  signal(SIGKILL);
  wait(std::chrono::seconds(10));
}

std::string child_process::log() const {
  std::ifstream in(log_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string child_process::wait_for(const std::string& re, std::chrono::milliseconds timeout) {
  const std::regex r(re);
  for (auto until = std::chrono::steady_clock::now() + timeout; std::chrono::steady_clock::now() < until;) {
    std::smatch m;
    const std::string text = log();
    if (std::regex_search(text, m, r)) return m.size() > 1 ? m[1].str() : m[0].str();
    if (poll() >= 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return "";
}

int64_t child_process::resident_bytes() const {
  if (status_ >= 0) return -1;
  std::ifstream in("/proc/" + std::to_string(pid_) + "/statm");
  int64_t size = 0, resident = -1;
  if (!(in >> size >> resident)) return -1;
  return resident * ::sysconf(_SC_PAGESIZE);
}

int64_t child_process::open_fds() const {
  if (status_ >= 0) return -1;
  std::error_code ec;
  int64_t n = 0;
  for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid_) + "/fd", ec), end; !ec && it != end;
       it.increment(ec))
    ++n;
  return ec ? -1 : n;
}

netns_host::netns_host(const std::string& name, const std::string& veth, int subnet)
    : here("10.213." + std::to_string(subnet) + ".1"),
      there("10.213." + std::to_string(subnet) + ".2"),
      name_(name),
      veth_(veth) {
  ok_ = sh("ip netns add " + name_) && sh("ip link add " + veth_ + "a type veth peer name " + veth_ + "b") &&
        sh("ip link set " + veth_ + "b netns " + name_) && sh("ip addr add " + here + "/30 dev " + veth_ + "a") &&
        sh("ip link set " + veth_ + "a up") &&
        sh("ip netns exec " + name_ + " ip addr add " + there + "/30 dev " + veth_ + "b") &&
        sh("ip netns exec " + name_ + " ip link set " + veth_ + "b up") &&
        sh("ip netns exec " + name_ + " ip link set lo up");
}

netns_host::netns_host(const std::string& name, const std::string& veth, const std::string& bridge,
                       std::string here_addr, std::string there_addr)
    : here(std::move(here_addr)), there(std::move(there_addr)), name_(name), veth_(veth) {
  ok_ = sh("ip netns add " + name_) && sh("ip link add " + veth_ + "a type veth peer name " + veth_ + "b") &&
        sh("ip link set " + veth_ + "b netns " + name_) && sh("ip link set " + veth_ + "a master " + bridge) &&
        sh("ip link set " + veth_ + "a up") &&
        sh("ip netns exec " + name_ + " ip addr add " + there + "/24 dev " + veth_ + "b") &&
        sh("ip netns exec " + name_ + " ip link set " + veth_ + "b up") &&
        sh("ip netns exec " + name_ + " ip link set lo up");
}

netns_host::~netns_host() {
  sh("ip link del " + veth_ + "a");
  sh("ip netns del " + name_);
}

bool netns_host::cut() { return sh("ip link set " + veth_ + "a down"); }
bool netns_host::heal() { return sh("ip link set " + veth_ + "a up"); }

bool netns_host::sh(const std::string& cmd) { return run_sh(cmd, why_); }

bool run_sh(const std::string& cmd, std::string& why) {
  const std::string err = "/tmp/tandem-netns-" + std::to_string(::getpid()) + ".err";
  const int rc = std::system((cmd + " 2>" + err).c_str());
  if (rc != 0 && why.empty()) {
    std::ifstream in(err);
    std::getline(in, why);
    why = "'" + cmd + "' failed: " + why;
  }
  std::filesystem::remove(err);
  return rc == 0;
}

netns_lan::netns_lan(const std::string& bridge, int subnet)
    : bridge_(bridge), here_("10.213." + std::to_string(subnet) + ".1"), subnet_(subnet) {
  ok_ = run_sh("ip link add " + bridge_ + " type bridge", why_) &&
        run_sh("ip addr add " + here_ + "/24 dev " + bridge_, why_) && run_sh("ip link set " + bridge_ + " up", why_);
}

netns_lan::~netns_lan() {
  std::string ignored;
  run_sh("ip link del " + bridge_, ignored);
}

std::unique_ptr<netns_host> netns_lan::add(const std::string& name, const std::string& veth, int k) {
  return std::make_unique<netns_host>(name, veth, bridge_, here_,
                                      "10.213." + std::to_string(subnet_) + "." + std::to_string(10 + k));
}

uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

}  // namespace tandem::bench
