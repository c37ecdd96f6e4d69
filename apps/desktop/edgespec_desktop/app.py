"""The chat window: conversation, prompt, Send/Stop, sampling options and a live acceptance line.

Every model call goes through a ChatWorker on its own QThread; this module only keeps the message
history and shows what the worker reports. Tokens a draft proposed and the target accepted are shown
in green, so speculation is visible as it happens.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PySide6.QtCore import Qt, QThread
from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QApplication,
    QDoubleSpinBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from edgespec_desktop.worker import ChatWorker, Progress

DRAFT_COLOR = QColor("#1a7f37")  # accepted draft tokens
ERROR_STYLE = "color: #b42318;"


def status_text(progress: Progress) -> str:
    """The status line for a generation, e.g. 'accepted 12/20 drafts (60%) · 18 tokens · 41.3 tok/s'."""
    line = (f"accepted {progress.accepted}/{progress.drafted} drafts ({progress.acceptance_rate:.0%}) · "
            f"{progress.generated} tokens · {progress.tokens_per_second:.1f} tok/s")
    if progress.finish_reason is not None:
        line += f" · finish: {progress.finish_reason}"
    return line


class ChatWindow(QMainWindow):
    def __init__(self, target: str | Path | None = None, draft: str = "ngram", *, threads: int | None = None):
        """A chat on target (None: the default model) with draft (a GGUF file, "ngram" or "none").

        threads: CPU threads for the models (default: all cores, at most 8).
        """
        super().__init__()
        self.setWindowTitle("edgespec chat")
        self.resize(760, 560)
        self.history: list[dict] = []  # chat messages, as the engine takes them
        self.target, self.draft = target, draft  # the pair loaded (or being loaded at start)
        self.description = None  # of the loaded pair, for the label
        self.busy = self.generating = False

        self._build_widgets()
        self._build_menu()

        self.worker_thread = QThread(self)
        self.worker = ChatWorker(threads)
        self.worker.moveToThread(self.worker_thread)
        self.worker.loaded.connect(self._on_loaded)
        self.worker.piece.connect(self._on_piece)
        self.worker.finished.connect(self._on_finished)
        self.worker.failed.connect(self._on_failed)
        self.worker_thread.start()
        self._load(target, draft)

    def _build_widgets(self) -> None:
        self.model_label = QLabel()
        self.conversation = QTextEdit(readOnly=True)
        self.conversation.setFont(QFont("monospace", 10))
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=2.0, singleStep=0.1, value=0.0,
                                          toolTip="0 = greedy")
        self.max_tokens = QSpinBox(minimum=1, maximum=4096, value=256)
        self.prompt = QLineEdit(placeholderText="Ask something and press Enter")
        self.send_button = QPushButton("Send")
        self.stop_button = QPushButton("Stop", enabled=False)
        self.status = QLabel(wordWrap=True)

        self.prompt.returnPressed.connect(self.send)
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(self.stop)

        options = QHBoxLayout()
        options.addWidget(QLabel("Temperature"))
        options.addWidget(self.temperature)
        options.addWidget(QLabel("Max tokens"))
        options.addWidget(self.max_tokens)
        options.addStretch()
        options.addWidget(QLabel("green = accepted draft tokens", styleSheet=f"color: {DRAFT_COLOR.name()};"))
        row = QHBoxLayout()
        row.addWidget(self.prompt)
        row.addWidget(self.send_button)
        row.addWidget(self.stop_button)

        layout = QVBoxLayout()
        layout.addWidget(self.model_label)
        layout.addWidget(self.conversation)
        layout.addLayout(options)
        layout.addLayout(row)
        layout.addWidget(self.status)
        central = QWidget()
        central.setLayout(layout)
        self.setCentralWidget(central)

    def _build_menu(self) -> None:
        model = self.menuBar().addMenu("&Model")
        for text, slot in [("Target GGUF file…", self._pick_target_file),
                           ("Target ONNX folder…", self._pick_target_folder),
                           ("Draft GGUF file…", self._pick_draft_file),
                           ("Draft: n-gram prompt lookup", lambda: self.choose_draft("ngram")),
                           ("Draft: none (target only)", lambda: self.choose_draft("none"))]:
            model.addAction(text, slot)
        self.busy_actions = model.actions()  # not while loading or generating
        model.addSeparator()
        model.addAction("Quit", self.close)
        chat = self.menuBar().addMenu("&Conversation")
        self.busy_actions.append(chat.addAction("New conversation", self.new_conversation))

    # choosing models: the dialogs end in choose_target / choose_draft, which tests call directly

    def _pick_target_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Target model", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.choose_target(path)

    def _pick_target_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Target ONNX export folder")
        if path:
            self.choose_target(path)

    def _pick_draft_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Draft model", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.choose_draft(path)

    def choose_target(self, path: str | Path) -> None:
        """Load `path` as the target, keeping the current draft; on failure the current pair stays."""
        self._load(path, self.draft)

    def choose_draft(self, draft: str | Path) -> None:
        """Load `draft` (a file, "ngram" or "none") for the current target; on failure the current pair stays."""
        self._load(self.target, draft)

    def _load(self, target, draft) -> None:
        self._set_busy(True)
        self.model_label.setText("loading models and measuring draft costs …")
        self._show_status("loading …")
        self.worker.load_models(target, draft)

    # chatting

    def send(self) -> None:
        """Send the prompt as the next user message and stream the answer into the conversation."""
        text = self.prompt.text().strip()
        if not text or self.busy:
            return
        self.prompt.clear()
        self.history.append({"role": "user", "content": text})
        self._append(f"You: {text}\n", bold=True)
        self._append("Assistant: ", bold=True)
        self._set_busy(True, generating=True)
        self._show_status("generating …")
        self.worker.start_answer(self.history, self.max_tokens.value(), self.temperature.value())

    def stop(self) -> None:
        """Stop the answer being generated; what came so far stays in the conversation."""
        # a direct call, not a signal to the worker: that would queue behind the answer it should stop
        self.worker.stop()

    def new_conversation(self) -> None:
        if not self.busy:
            self.history.clear()
            self.conversation.clear()
            self._show_status("new conversation")

    def _on_loaded(self, target: Path, draft: str, description: str) -> None:
        self.target, self.draft, self.description = target, draft, description
        self.model_label.setText(description)
        self._show_status("ready")
        self._set_busy(False)

    def _on_piece(self, text: str, from_draft: bool, progress: Progress) -> None:
        self._append(text, color=DRAFT_COLOR if from_draft else None)
        self._show_status(status_text(progress))

    def _on_finished(self, answer: str, progress: Progress) -> None:
        self.history.append({"role": "assistant", "content": answer})
        self._append("\n\n")
        line = status_text(progress)
        if progress.finish_reason == "context":
            line += " · the context is full: Conversation > New conversation"
        self._show_status(line)
        self._set_busy(False)

    def _on_failed(self, message: str) -> None:
        if self.generating:  # the question got no answer: leave it out of the next prompt
            self.history.pop()
            self._append("[not answered]\n\n")
        self._show_status(f"error: {message}", error=True)
        self.model_label.setText(self.description or "no model loaded: pick one in the Model menu")
        QMessageBox(QMessageBox.Icon.Warning, "edgespec", message, parent=self).open()  # not modal: never blocks
        self._set_busy(False)

    # helpers

    def _append(self, text: str, *, color: QColor | None = None, bold: bool = False) -> None:
        cursor = self.conversation.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        fmt = QTextCharFormat()
        if color is not None:
            fmt.setForeground(color)
        if bold:
            fmt.setFontWeight(QFont.Weight.Bold)
        cursor.insertText(text, fmt)
        self.conversation.setTextCursor(cursor)
        self.conversation.ensureCursorVisible()

    def _show_status(self, text: str, *, error: bool = False) -> None:
        self.status.setText(text)
        self.status.setStyleSheet(ERROR_STYLE if error else "")

    def _set_busy(self, busy: bool, *, generating: bool = False) -> None:
        self.busy, self.generating = busy, generating
        self.send_button.setEnabled(not busy)
        self.stop_button.setEnabled(generating)
        for action in self.busy_actions:
            action.setEnabled(not busy)

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self.worker.stop()
        self.worker_thread.quit()
        self.worker_thread.wait()  # a load in progress finishes first; an answer stops at its next event
        self.worker.close_engine()
        super().closeEvent(event)


def main(argv: list[str] | None = None) -> int:
    """Run the app: `python -m edgespec_desktop [TARGET] [--draft DRAFT] [--threads N]`."""
    parser = argparse.ArgumentParser(prog="python -m edgespec_desktop", description="edgespec chat (Qt)")
    parser.add_argument("target", nargs="?", help="GGUF file or ONNX export folder [default: the default model]")
    parser.add_argument("--draft", default="ngram", help="a GGUF file, 'ngram' (prompt lookup) or 'none'")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads [default: the cores it may run on, at most 8]")
    args = parser.parse_args(argv)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    window = ChatWindow(args.target, args.draft, threads=args.threads)
    window.show()
    window.prompt.setFocus(Qt.FocusReason.OtherFocusReason)
    return app.exec()
