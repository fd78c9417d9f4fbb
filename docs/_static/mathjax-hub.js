// The Jupyter widget manager typesets widget text with MathJax 2's `MathJax.Hub.Queue(["Typeset", Hub, el])`;
// the site serves MathJax 3, which has no Hub. This script adds one to the page's MathJax 3 configuration
// (Sphinx's, written just before; MathJax reads it when it loads, deferred, after this script): jobs queued
// before MathJax is ready wait, later ones are typeset at once.
(function () {
  "use strict";
  const waiting = [];
  function queue(...jobs) {
    for (const job of jobs) {
      if (Array.isArray(job) && job[0] === "Typeset" && job[2]) {
        if (window.MathJax && typeof window.MathJax.typesetPromise === "function") {
          window.MathJax.typesetPromise([job[2]]);
        } else {
          waiting.push(job[2]);
        }
      }
    }
  }
  const config = window.MathJax || {};
  window.MathJax = {
    ...config,
    Hub: { Queue: queue },
    startup: {
      ...config.startup,
      ready() {
        window.MathJax.startup.defaultReady();
        window.MathJax.Hub = { Queue: queue };
        window.MathJax.startup.promise.then(() => waiting.length && window.MathJax.typesetPromise(waiting.splice(0)));
      },
    },
  };
})();
